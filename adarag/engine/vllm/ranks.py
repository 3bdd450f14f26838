"""Which KV heads a tensor-parallel rank of vLLM holds, so each rank loads only its share.

vLLM splits the KV heads of every layer evenly over the ranks; with more ranks than KV heads
each rank holds one head, replicated over ``world_size // num_kv_heads`` consecutive ranks
(``QKVParallelLinear``). Plain Python, tested for both cases without vLLM.
"""

from __future__ import annotations


def kv_heads_of_rank(num_kv_heads: int, world_size: int, rank: int) -> range:
    """The KV heads rank ``rank`` of ``world_size`` holds, as a range of head indices.

    Raises:
        ValueError: The heads cannot be split over the ranks the way vLLM splits them.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} ranks")
    if world_size >= num_kv_heads:
        if world_size % num_kv_heads:
            raise ValueError(f"{world_size} ranks cannot replicate {num_kv_heads} KV heads evenly")
        head = rank // (world_size // num_kv_heads)
        return range(head, head + 1)
    if num_kv_heads % world_size:
        raise ValueError(f"{num_kv_heads} KV heads cannot be split over {world_size} ranks")
    per_rank = num_kv_heads // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)
