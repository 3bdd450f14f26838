"""Every kind of damage to stored chunk KV is detected, set aside and recomputed.

Each case warms three chunks with a tiny model (their independent KV on disk; the first chunk's
entry is also the exact KV of the prompt's first chunk, a hard hit), damages the first chunk's
file, reopens the store as a new process would and answers. The damaged chunk must be a miss
(computed afresh, so the answer equals the undamaged run's bit for bit: a hard hit and a full
recomputation are both exact), its file must be deleted or quarantined, and the other entries
must still be served.

A file forged with a consistent checksum, keys and shape but different numbers cannot be told
from a genuine one without a secret; everything short of that is covered here.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from adarag import AdaRAG
from adarag.cache.disk import QUARANTINE, SUFFIX
from adarag.cache.entry_format import entry_digests
from adarag.cache.keys import digest
from adarag.config import AdaRagConfig
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION, load_engine

PARAMS = GenerationParams(max_new_tokens=6)
STATIC = {"enabled": False}


def _load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}, handle.metadata()


def _rewrite(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Save a well-formed file, with a checksum consistent with what it now holds."""
    metadata = {**metadata, "checksum": entry_digests(metadata, tensors, None)[0]}
    save_file(tensors, str(path), metadata=metadata)


def _flip_data(path: Path, _: Path) -> None:
    data = bytearray(path.read_bytes())
    for offset in range(1, 65):
        data[-offset * 7] ^= 0x5A
    path.write_bytes(bytes(data))


def _flip_header(path: Path, _: Path) -> None:
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path, _: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _zero_length(path: Path, _: Path) -> None:
    path.write_bytes(b"")


def _wrong_layers(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    _rewrite(path, {name: t[:1].clone() for name, t in tensors.items()}, metadata)


def _wrong_dtype(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    _rewrite(path, {name: t.to(torch.float16) for name, t in tensors.items()}, metadata)


def _wrong_head_dim(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    _rewrite(path, {name: t[..., :-1].clone() for name, t in tensors.items()}, metadata)


def _wrong_token_count(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    _rewrite(path, {name: t[:, :-1].clone() for name, t in tensors.items()}, metadata)


def _missing_tensor(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    save_file({"k": tensors["k"]}, str(path), metadata=metadata)


def _edited_start_position(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    save_file(tensors, str(path), metadata={**metadata, "start_position": "7"})


def _edited_checksum(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    save_file(tensors, str(path), metadata={**metadata, "checksum": "0" * 32})


def _claims_other_keys(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    keys = json.loads(metadata["keys"])
    _rewrite(path, tensors, {**metadata, "keys": json.dumps(keys[:1])})


def _swapped(path: Path, directory: Path) -> None:
    other = next(p for p in directory.glob(f"*{SUFFIX}") if p != path and _num_keys(p) == 2)
    swap = directory / "swap"
    os.replace(path, swap)
    os.replace(other, path)
    os.replace(swap, other)


def _other_model(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    _rewrite(path, tensors, {**metadata, "model": "another-model-float32-float32"})


def _old_format(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    _rewrite(path, tensors, {**metadata, "format": "adarag-kv-1"})


def _unknown_format(path: Path, _: Path) -> None:
    tensors, metadata = _load(path)
    _rewrite(path, tensors, {**metadata, "format": "adarag-kv-9"})


def _directory(path: Path, _: Path) -> None:
    path.unlink()
    path.mkdir()


def _symlink_elsewhere(path: Path, directory: Path) -> None:
    target = directory.parent / "outside.txt"
    target.write_text("not a KV file")
    path.unlink()
    path.symlink_to(target)


def _num_keys(path: Path) -> int:
    return len(json.loads(_load(path)[1]["keys"]))


DAMAGE: dict[str, Callable[[Path, Path], None]] = {
    "flipped tensor bytes": _flip_data,
    "flipped header byte": _flip_header,
    "truncated to a third": _truncate,
    "zero-length file": _zero_length,
    "valid file, wrong layer count": _wrong_layers,
    "valid file, wrong dtype": _wrong_dtype,
    "valid file, wrong head dim": _wrong_head_dim,
    "valid file, wrong token count": _wrong_token_count,
    "a tensor missing": _missing_tensor,
    "edited metadata (start position)": _edited_start_position,
    "edited checksum": _edited_checksum,
    "edited keys, checksum redone": _claims_other_keys,
    "two entries' files swapped": _swapped,
    "file of another model": _other_model,
    "file of an older format": _old_format,
    "file of an unknown (newer) format": _unknown_format,
    "a directory in its place": _directory,
    "a symlink to a non-KV file": _symlink_elsewhere,
}
SURVIVES_ON_DISK = {"two entries' files swapped"}  # both files are damaged by the swap


@pytest.fixture(scope="module")
def engine(tiny_checkpoints, tmp_path_factory):
    home = tmp_path_factory.mktemp("gen-home")
    config = AdaRagConfig.build(home=home, engine={"model": str(tiny_checkpoints["llama"])})
    return load_engine(config)


@pytest.fixture()
def make(engine, tiny_checkpoints, tiny_config):
    config = tiny_config(tiny_checkpoints["llama"], augment=STATIC)
    return lambda: AdaRAG(config, loaded_engine=engine)


def _answer(rag: AdaRAG) -> tuple[str, tuple[str, ...]]:
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    return answer.text, answer.trace.steps[-1].tiers


def _entry_path(rag: AdaRAG, chunk: str) -> Path:
    keys = rag.cache.keys([rag.prompts.chunk_ids(chunk)])
    return rag.kv_directory / f"{digest(*sorted([keys.independent[0], keys.alone[0]]))}{SUFFIX}"


@pytest.fixture(scope="module")
def clean_answer(engine, tiny_checkpoints, tmp_path_factory):
    config = AdaRagConfig.build(
        home=tmp_path_factory.mktemp("clean"),
        engine={"model": str(tiny_checkpoints["llama"])},
        augment=STATIC,
        experimental={"augment": {"num_lens_layers": 2}},
    )
    rag = AdaRAG(config, loaded_engine=engine)
    rag.warm(CHUNKS)
    return _answer(AdaRAG(config, loaded_engine=engine))


def test_the_undamaged_store_serves_every_chunk(make, clean_answer):
    make().warm(CHUNKS)
    text, tiers = _answer(make())
    assert (text, tiers) == clean_answer
    assert tiers == ("hard", "independent", "independent")


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_kv_is_detected_set_aside_and_recomputed(make, clean_answer, kind, ledger):
    writer = make()
    writer.warm(CHUNKS)
    directory = writer.kv_directory
    damaged = _entry_path(writer, CHUNKS[0])
    others = [_entry_path(writer, chunk) for chunk in CHUNKS[1:]]
    DAMAGE[kind](damaged, directory)

    reader = make()  # a restart: the store scans the directory again
    text, tiers = _answer(reader)
    reader.close()

    served_bad = tiers[0] != "miss"
    wrong = text != clean_answer[0]
    gone = not damaged.is_file() or _entry_readable(damaged, reader)
    lost = 0 if kind in SURVIVES_ON_DISK else sum(not path.is_file() for path in others)
    ledger.record(
        "stored KV: " + kind,
        detected=int(not served_bad and gone),
        wrong_answers=int(wrong),
        data_lost=lost,
    )
    assert not served_bad, f"{kind}: the damaged entry was served ({tiers})"
    assert not wrong, f"{kind}: {text!r} differs from the clean answer {clean_answer[0]!r}"
    assert gone, f"{kind}: the damaged file is still in place"
    assert lost == 0, f"{kind}: undamaged entries were lost"
    if kind not in SURVIVES_ON_DISK:
        assert tiers[1:] == ("independent", "independent")
    quarantined = directory / QUARANTINE
    quarantine = {
        "file of another model",
        "file of an unknown (newer) format",
        "a directory in its place",
    }
    if kind in quarantine:
        assert (quarantined / damaged.name).exists(), f"{kind}: not quarantined"


def _entry_readable(path: Path, rag: AdaRAG) -> bool:
    """A file at the damaged entry's path after the run is a fresh, valid write-back."""
    store = rag.cache.store
    return store.disk is not None and store.disk.read(path.name.removesuffix(SUFFIX)) is not None


def test_a_file_set_aside_is_never_read_again(make, caplog):
    writer = make()
    writer.warm(CHUNKS)
    damaged = _entry_path(writer, CHUNKS[0])
    _flip_data(damaged, writer.kv_directory)
    first = make()
    _answer(first)
    first.close()
    caplog.clear()
    second = make()
    _answer(second)
    assert "corrupted KV cache file" not in caplog.text
    shutil.rmtree(writer.kv_directory)
