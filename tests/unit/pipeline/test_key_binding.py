"""What stored chunk KV is bound to: it is never served to a pipeline that would compute other KV.

Each case warms one chunk with a pipeline, then asks a pipeline on the same home that differs in
one setting: the chunk must miss (computed afresh), while an identical pipeline hits.
"""

from __future__ import annotations

import json
import shutil

import pytest

from adarag import AdaRAG
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION

PARAMS = GenerationParams(max_new_tokens=2)
STATIC = {"enabled": False}


def _first_tier(rag: AdaRAG) -> str:
    answer = rag.query(QUESTION, chunks=[CHUNKS[0]], params=PARAMS)
    return answer.trace.steps[-1].tiers[0]


@pytest.fixture()
def warmed(tiny_checkpoints, tiny_config):
    def make(**overrides):
        return AdaRAG(tiny_config(tiny_checkpoints["llama"], augment=STATIC, **overrides))

    assert make().warm([CHUNKS[0]]) == 1
    return make


def test_the_same_settings_hit_the_stored_kv(warmed):
    assert _first_tier(warmed()) == "hard"  # the one-chunk prompt's exact KV, from disk


@pytest.mark.parametrize(
    "overrides",
    [
        {"prompt": {"system_prompt": "Answer in French."}},
        {"prompt": {"chunk_separator": "\n---\n"}},
        {"prompt": {"context_intro": "Documents:\n"}},
        {"cache": {"store": {"storage_dtype": "float16"}}},
        {"cache": {"store": {"storage_dtype": "int8"}}},
        {"engine": {"dtype": "bfloat16"}},
    ],
    ids=["system-prompt", "separator", "template", "storage-dtype", "storage-int8", "engine-dtype"],
)
def test_kv_computed_under_other_settings_is_never_served(warmed, overrides):
    assert _first_tier(warmed(**overrides)) == "miss"


def test_kv_of_another_model_is_never_served(warmed, tiny_checkpoints, tiny_config):
    other = AdaRAG(tiny_config(tiny_checkpoints["qwen2"], augment=STATIC))
    assert _first_tier(other) == "miss"


def test_the_namespace_names_model_and_both_dtypes(warmed):
    rag = warmed(cache={"store": {"storage_dtype": "bfloat16"}})
    assert rag.kv_namespace == f"{rag.engine.fingerprint}-float32-bfloat16"
    assert (rag.config.home / "kv" / warmed().kv_namespace).is_dir()


def test_kv_under_another_tokenizer_is_never_served(
    warmed, tiny_checkpoints, tiny_config, tmp_path
):
    """Same weights and config, a tokenizer without merges: other token ids, other keys."""
    checkpoint = tmp_path / "retokenized"
    shutil.copytree(tiny_checkpoints["llama"], checkpoint)
    tokenizer_file = checkpoint / "tokenizer.json"
    tokenizer = json.loads(tokenizer_file.read_text())
    tokenizer["model"]["merges"] = []
    tokenizer_file.write_text(json.dumps(tokenizer))
    other = AdaRAG(tiny_config(checkpoint, augment=STATIC))
    assert other.kv_namespace == warmed().kv_namespace  # the fingerprint cannot tell them apart
    assert _first_tier(other) == "miss"


def test_int8_stored_kv_is_served_to_the_same_settings(warmed):
    int8 = {"cache": {"store": {"storage_dtype": "int8"}}}
    assert warmed(**int8).warm([CHUNKS[0]]) == 1
    assert _first_tier(warmed(**int8)) == "hard"
