"""The bytes of one signed hand-over: fused KV bound to its id and its prompt.

A hand-over is a safetensors blob of ``k`` and ``v`` whose string metadata names the format, the
handoff id, the :func:`~adarag.engine.vllm.handoff.prompt_digest` of the context tokens, their
number and the public id of the key that signed it, and carries an HMAC-SHA256 under the
hand-over key (``engine.vllm_handoff_key`` on the front end, the same key in every replica's
connector) over all of that and each tensor's name, dtype, shape and bytes.

A reader checks the header first (:meth:`HandoffSigner.check_header`: cheap, what vLLM's
scheduler does before it claims the tokens), then everything (:meth:`HandoffSigner.decode`: what
each worker does before it writes a row). A file written for another request or prompt (swapped,
replayed), signed under another key, forged, cut short or of another shape is refused with its
reason, and vLLM computes the prompt itself. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import hmac

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from adarag.engine.vllm.handoff import FusedContext, HandoffBinding
from adarag.kv import key_id, safetensors_metadata, update_digests

FORMAT = "adarag-handoff-1"
KEY_PURPOSE = b"vLLM hand-over"
MAX_HEADER_BYTES = 64 * 1024
"""A hand-over's safetensors header (two tensors, six strings) is far smaller."""
_SIGNATURE_CONTEXT = b"adarag-kv-handoff-signature\x00"


class HandoffRefused(Exception):
    """Bytes that must not reach vLLM's cache; the message says why."""


class HandoffSigner:
    """Writes and verifies hand-overs under one key.

    Args:
        key: The hand-over key shared by the front end and the replicas (never logged).
    """

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.key_id = key_id(key, KEY_PURPOSE)

    def encode(self, binding: HandoffBinding, context: FusedContext) -> bytes:
        """The signed bytes of ``context`` for ``binding``.

        Raises:
            ValueError: ``context`` does not hold ``binding.num_tokens`` rows.
        """
        if context.num_tokens != binding.num_tokens:
            raise ValueError(f"{context.num_tokens} rows of KV for {binding.num_tokens} tokens")
        tensors = _tensors_of(context)
        metadata = {
            "format": FORMAT,
            "handoff_id": binding.handoff_id,
            "prompt": binding.prompt_digest,
            "num_tokens": str(binding.num_tokens),
            "key_id": self.key_id,
        }
        metadata["signature"] = self._signature(metadata, tensors)
        return save(tensors, metadata=metadata)

    def check_header(self, data: bytes, binding: HandoffBinding) -> dict[str, str]:
        """The header's metadata once it names ``binding`` and this key (the tensors unread).

        Args:
            data: The hand-over's first bytes (at least its header).
            binding: The request's id and prompt.

        Raises:
            HandoffRefused: The header is unreadable, or names another format, request, prompt
                or key.
        """
        try:
            metadata = safetensors_metadata(data, MAX_HEADER_BYTES)
        except ValueError as err:
            raise HandoffRefused(f"its header is unreadable ({err})") from None
        if metadata.get("format") != FORMAT:
            raise HandoffRefused(f"format {metadata.get('format')!r}, not {FORMAT}")
        if metadata.get("key_id") != self.key_id:
            raise HandoffRefused(
                f"signed under another key (key id {metadata.get('key_id')!r}, this side's "
                f"{self.key_id!r}): give the front end and every replica the same hand-over key"
            )
        if metadata.get("handoff_id") != binding.handoff_id:
            raise HandoffRefused(
                f"it was written for handoff {metadata.get('handoff_id')!r} (swapped or renamed)"
            )
        if metadata.get("prompt") != binding.prompt_digest or metadata.get("num_tokens") != str(
            binding.num_tokens
        ):
            raise HandoffRefused("it was computed for another prompt than this request's")
        return metadata

    def decode(self, data: bytes, binding: HandoffBinding, heads: range | None) -> FusedContext:
        """The verified context in ``data``, KV heads ``heads`` only (all when None).

        Raises:
            HandoffRefused: A check of :meth:`check_header` fails, the bytes are cut short, the
                signature does not verify, or the tensors are not ``binding.num_tokens`` rows of
                one shape.
        """
        metadata = self.check_header(data, binding)
        try:
            tensors = load(data)
            k, v = tensors["k"], tensors["v"]
        except (SafetensorError, KeyError, ValueError) as err:
            raise HandoffRefused(f"its tensors are unreadable ({err})") from None
        found = metadata.get("signature", "")
        if not hmac.compare_digest(found.encode(), self._signature(metadata, tensors).encode()):
            raise HandoffRefused("its signature does not verify (forged or edited)")
        if set(tensors) != {"k", "v"} or k.shape != v.shape or k.dim() != 4:
            raise HandoffRefused(f"its tensors are not K and V of one shape ({tuple(k.shape)})")
        if k.shape[1] != binding.num_tokens:
            raise HandoffRefused(f"it holds {k.shape[1]} rows, {binding.num_tokens} expected")
        if heads is not None:
            k, v = k[:, :, heads.start : heads.stop], v[:, :, heads.start : heads.stop]
        return FusedContext(k.contiguous(), v.contiguous())

    def _signature(self, metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> str:
        hasher = hmac.new(self._key, _SIGNATURE_CONTEXT, hashlib.sha256)
        covered = {name: value for name, value in metadata.items() if name != "signature"}
        update_digests([hasher], covered, tensors)
        return hasher.hexdigest()


def _tensors_of(context: FusedContext) -> dict[str, torch.Tensor]:
    """``context`` as the tensors safetensors stores: ``k`` and ``v``, contiguous, apart.

    safetensors stores no two tensors that share memory, so V is copied when it does.
    """
    k, v = context.k.contiguous(), context.v.contiguous()
    if k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr():
        v = v.clone()
    return {"k": k, "v": v}
