"""A packaged profile is found by the weights' fingerprint: renamed copies keep their profile."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from adarag.engine.spec import model_fingerprint, weights_fingerprint
from adarag.profiles import find_profile, generic_profile


def _resaved(source, target, *, negate: str | None = None):
    """A copy of ``source`` saved again: tensors in reverse order, other metadata, a config key."""
    shutil.copytree(source, target)
    tensors = load_file(target / "model.safetensors")
    if negate is not None:
        tensors[negate] = -tensors[negate]
    reordered = {name: tensors[name].contiguous() for name in sorted(tensors, reverse=True)}
    (target / "model.safetensors").unlink()
    save_file(reordered, target / "model.safetensors", metadata={"format": "pt", "by": "other"})
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "transformers_version": "0.0.1"}))
    return target


def test_the_weights_fingerprint_ignores_name_config_and_file_layout(tiny_checkpoints, tmp_path):
    original = tiny_checkpoints["llama"]
    copy = _resaved(original, tmp_path / "renamed")
    assert weights_fingerprint(copy) == weights_fingerprint(original)
    assert model_fingerprint(copy) != model_fingerprint(original)  # the KV namespace differs
    name = "model.layers.0.mlp.down_proj.weight"
    edited = _resaved(original, tmp_path / "edited", negate=name)
    assert weights_fingerprint(edited) != weights_fingerprint(original)


def test_the_weights_fingerprint_is_cached_across_processes(tiny_checkpoints, tmp_path):
    cache_file = tmp_path / "hashes.json"
    digest = weights_fingerprint(tiny_checkpoints["llama"], cache_file)
    entries = json.loads(cache_file.read_text())
    (entry,) = [value for key, value in entries.items() if key.startswith("tensors:")]
    assert entry["tensors"] and weights_fingerprint(tiny_checkpoints["llama"], cache_file) == digest


def _packaged(tmp_path, checkpoint, name="Tiny-Packaged"):
    profile = generic_profile(name, "f" * 16, 2)
    profile = profile.__class__(**{**profile.__dict__, "transition_layer": 1})
    packaged = tmp_path / "packaged"
    packaged.mkdir()
    text = json.loads(profile.to_json())
    text["weights_fingerprint"] = weights_fingerprint(checkpoint)
    (packaged / f"{name}.json").write_text(json.dumps(text))
    return packaged


def test_a_renamed_copy_finds_the_packaged_profile_by_its_weights(tiny_checkpoints, tmp_path):
    original = tiny_checkpoints["llama"]
    packaged = _packaged(tmp_path, original)
    copy = _resaved(original, tmp_path / "myllama")
    found = find_profile(
        "myllama", model_fingerprint(copy), 2, [], lambda: weights_fingerprint(copy), packaged
    )
    assert found is not None and found.model == "Tiny-Packaged" and found.transition_layer == 1
    # without the weights' digest the name alone finds nothing, as before
    assert find_profile("myllama", model_fingerprint(copy), 2, [], None, packaged) is None


def test_other_weights_do_not_take_a_packaged_profile(tiny_checkpoints, tmp_path):
    packaged = _packaged(tmp_path, tiny_checkpoints["llama"])
    other = tiny_checkpoints["qwen2"]
    digest = weights_fingerprint(other)
    assert find_profile("qwen2", "0" * 16, 2, [], lambda: digest, packaged) is None


def test_the_weights_are_not_digested_without_a_packaged_profile_of_that_depth(
    tiny_checkpoints, tmp_path
):
    packaged = _packaged(tmp_path, tiny_checkpoints["llama"])

    def refuse() -> str:
        raise AssertionError("digested a model no packaged profile can match")

    assert find_profile("deep-model", "0" * 16, 48, [], refuse, packaged) is None


def test_an_unreadable_checkpoint_falls_back_to_no_profile(tiny_checkpoints, tmp_path, caplog):
    packaged = _packaged(tmp_path, tiny_checkpoints["llama"])

    def unreadable() -> str:
        raise OSError("Input/output error")

    assert find_profile("x", "0" * 16, 2, [], unreadable, packaged) is None
    assert "cannot digest the weights of x" in caplog.text


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct"])
def test_each_packaged_profile_carries_its_weights_fingerprint(name):
    profile = find_profile(name, "not-this-one", 30 if name.startswith("Smol") else 24, [])
    assert profile is not None and len(profile.weights_fingerprint or "") == 16
