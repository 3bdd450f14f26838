"""Forged chunk KV: consistent checksum, keys and shapes, different numbers.

The forger rewrites the first chunk's entry -- on disk, and in the shared tier on a real Valkey
server -- with its tensors negated and the plain checksum recomputed, so every check short of a
secret passes. With ``cache.store.signing_key`` the reader must reject the entry (its HMAC fails),
delete it, count it, recompute the chunk and answer exactly as the unforged store does. Without
a key the forged entry is served: the store trusts whoever can write its directory or server,
as docs/reliability.md and the setting's description say.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load, save, save_file

from adarag import AdaRAG
from adarag.cache.disk import SUFFIX
from adarag.cache.entry_format import entry_digests
from adarag.cache.keys import digest
from adarag.config import AdaRagConfig
from adarag.schema import GenerationParams
from tests.remote_server import client_of, running_server, url_of
from tests.unit.engine.helpers import CHUNKS, QUESTION, load_engine

PARAMS = GenerationParams(max_new_tokens=6)
STATIC = {"enabled": False}
KEY = "an-example-signing-key-of-32-bytes"


def _forged(tensors: dict[str, torch.Tensor], metadata: dict[str, str]):
    """The entry's tensors negated, its plain checksum made consistent again."""
    forged = {name: (-tensor).contiguous() for name, tensor in tensors.items()}
    return forged, {**metadata, "checksum": entry_digests(metadata, forged, None)[0]}


def _forge_file(path: Path) -> None:
    with safe_open(str(path), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        metadata = handle.metadata()
    forged, metadata = _forged(tensors, metadata)
    save_file(forged, str(path), metadata=metadata)


def _forge_value(data: bytes) -> bytes:
    length = int.from_bytes(data[:8], "little")
    metadata = json.loads(data[8 : 8 + length])["__metadata__"]
    forged, metadata = _forged(load(data), metadata)
    return save(forged, metadata=metadata)


@pytest.fixture(scope="module")
def engine(tiny_checkpoints, tmp_path_factory):
    home = tmp_path_factory.mktemp("gen-home")
    config = AdaRagConfig.build(home=home, engine={"model": str(tiny_checkpoints["llama"])})
    return load_engine(config)


@pytest.fixture(scope="module")
def clean_answer(engine, tiny_checkpoints, tmp_path_factory):
    config = AdaRagConfig.build(
        home=tmp_path_factory.mktemp("clean"),
        engine={"model": str(tiny_checkpoints["llama"])},
        augment=STATIC,
        experimental={"augment": {"num_lens_layers": 2}},
    )
    AdaRAG(config, loaded_engine=engine).warm(CHUNKS)
    return _answer(AdaRAG(config, loaded_engine=engine))


def _answer(rag: AdaRAG) -> tuple[str, tuple[str, ...]]:
    answer = rag.query(QUESTION, chunks=list(CHUNKS), params=PARAMS)
    return answer.text, answer.trace.steps[-1].tiers


def _entry_id(rag: AdaRAG, chunk: str) -> str:
    keys = rag.cache.keys([rag.prompts.chunk_ids(chunk)])
    return digest(*sorted([keys.independent[0], keys.alone[0]]))


def _make(engine, tiny_checkpoints, tiny_config, **store):
    config = tiny_config(tiny_checkpoints["llama"], augment=STATIC, cache={"store": store})
    return AdaRAG(config, loaded_engine=engine)


@pytest.mark.parametrize("signing", [True, False], ids=["signing on", "signing off"])
def test_a_forged_disk_entry_is_rejected_only_with_a_signing_key(
    engine, tiny_checkpoints, tiny_config, clean_answer, signing, ledger
):
    writer = _make(engine, tiny_checkpoints, tiny_config, signing_key=KEY)
    writer.warm(CHUNKS)
    path = writer.kv_directory / f"{_entry_id(writer, CHUNKS[0])}{SUFFIX}"
    _forge_file(path)

    reader = _make(engine, tiny_checkpoints, tiny_config, signing_key=KEY if signing else None)
    text, tiers = _answer(reader)
    stats = reader.cache.store.snapshot()
    if signing:
        ledger.record(
            "forged entry on disk (signing on)",
            detected=int(tiers[0] == "miss" and stats.signature_failures == 1),
            wrong_answers=int(text != clean_answer[0]),
        )
        assert tiers[0] == "miss" and tiers[1:] == ("independent", "independent")
        assert text == clean_answer[0]
        assert stats.signature_failures == 1
        # deleted: what the directory holds now is recomputed and signed
        reader.close()
        again = _make(engine, tiny_checkpoints, tiny_config, signing_key=KEY)
        assert _answer(again)[0] == clean_answer[0]
        assert again.cache.store.snapshot().signature_failures == 0
    else:  # documented: without a key, whoever writes the directory is trusted
        ledger.record(
            "forged entry on disk (signing off: writers trusted, as documented)",
            detected=0,
            wrong_answers=int(text != clean_answer[0]),
        )
        assert tiers[0] == "hard" and stats.signature_failures == 0


@pytest.mark.parametrize("signing", [True, False], ids=["signing on", "signing off"])
def test_a_forged_shared_tier_entry_is_rejected_only_with_a_signing_key(
    engine, tiny_checkpoints, tiny_config, clean_answer, signing, ledger, tmp_path
):
    with running_server() as server:
        url = url_of(server)
        shared = {"remote_url": url, "disk_capacity_bytes": 0}
        writer = _make(engine, tiny_checkpoints, tiny_config, signing_key=KEY, **shared)
        writer.warm(CHUNKS)
        client = client_of(server)
        (name,) = client.keys(f"*:e:{_entry_id(writer, CHUNKS[0])}")
        forged = _forge_value(client.get(name))
        client.set(name, forged)

        key = KEY if signing else None
        reader = _make(engine, tiny_checkpoints, tiny_config, signing_key=key, **shared)
        text, tiers = _answer(reader)
        stats = reader.cache.store.snapshot()
        if signing:
            ledger.record(
                "forged entry in the shared tier (signing on)",
                detected=int(tiers[0] == "miss" and stats.remote_signature_failures == 1),
                wrong_answers=int(text != clean_answer[0]),
            )
            assert tiers[0] == "miss" and text == clean_answer[0]
            assert stats.remote_signature_failures == 1 and stats.signature_failures == 1
            assert client.get(name) != forged  # deleted (and written again, signed)
        else:
            ledger.record(
                "forged entry in the shared tier (signing off: writers trusted, as documented)",
                detected=0,
                wrong_answers=int(text != clean_answer[0]),
            )
            assert tiers[0] == "hard" and stats.remote_signature_failures == 0


def test_unsigned_entries_are_recomputed_once_a_key_is_set(
    engine, tiny_checkpoints, tiny_config, clean_answer
):
    _make(engine, tiny_checkpoints, tiny_config).warm(CHUNKS)  # written without a key
    reader = _make(engine, tiny_checkpoints, tiny_config, signing_key=KEY)
    assert _answer(reader) == (clean_answer[0], ("miss", "miss", "miss"))
    # the three chunks and the system prompt's KV
    assert reader.cache.store.snapshot().signature_failures == 4


def test_the_signing_key_never_reaches_a_log_or_a_message(
    engine, tiny_checkpoints, tiny_config, caplog, tmp_path
):
    rag = _make(engine, tiny_checkpoints, tiny_config, signing_key=KEY)
    rag.warm(CHUNKS)
    rag.close()
    assert KEY not in repr(rag.config) and KEY not in str(rag.config.model_dump())
    assert KEY not in caplog.text
    key_file = tmp_path / "signing.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    from_file = _make(engine, tiny_checkpoints, tiny_config, signing_key_file=str(key_file))
    assert _answer(from_file)[1][0] == "hard"  # the same key, read from the file


def _entry_files(rag: AdaRAG) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in rag.kv_directory.glob(f"*{SUFFIX}")}


def test_a_store_given_another_key_keeps_the_shared_entries(
    engine, tiny_checkpoints, tiny_config, clean_answer, ledger
):
    """Regression (issue 45): one process with a mistyped key deleted every correctly signed
    entry of the directory it shares with the others."""
    writer = _make(engine, tiny_checkpoints, tiny_config, signing_key=KEY)
    writer.warm(CHUNKS)
    writer.close()
    before = _entry_files(writer)
    mistyped = _make(engine, tiny_checkpoints, tiny_config, signing_key="x" + KEY[1:])
    text, tiers = _answer(mistyped)
    failures = mistyped.cache.store.snapshot().signature_failures
    mistyped.close()  # its own entries stay in memory: nothing is overwritten on disk
    after = _entry_files(writer)
    ledger.record(
        "store given another signing key on a shared directory",
        detected=int(tiers == ("miss", "miss", "miss") and failures >= 4),
        wrong_answers=int(text != clean_answer[0]),
        data_lost=len(before) - sum(after.get(name) == data for name, data in before.items()),
    )
    ledger.extra["shared_directory_other_key"] = {
        "entries_before": len(before),
        "entries_after": len(after),
        "unchanged_after": sum(after.get(name) == data for name, data in before.items()),
        "reads_refused": failures,
    }
    assert text == clean_answer[0] and tiers == ("miss", "miss", "miss") and failures >= 4
    # every entry is still there, byte for byte (the other key's write-backs are new entries)
    assert {name: after.get(name) for name in before} == before
    # the right key still reuses them (a key the other store's newer write-back claims is
    # looked up further down the tiers)
    text, tiers = _answer(_make(engine, tiny_checkpoints, tiny_config, signing_key=KEY))
    assert text == clean_answer[0] and "miss" not in tiers
