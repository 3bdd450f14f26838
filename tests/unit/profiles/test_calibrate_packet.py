"""`adarag calibrate --packet` end to end on a tiny model: the bridge it fits, the pipeline reads.

The fit must lower the KL to full recomputation on the questions it trains on, resume from its
checkpoint, and write a file the profile names by digest.
"""

from __future__ import annotations

from adarag import AdaRAG
from adarag.cli import main
from adarag.config import AdaRagConfig
from adarag.profiles import ModelProfile
from tests.unit.engine.helpers import CHUNKS, QUESTION
from tests.unit.pipeline.packet_profile import ASKED
from tests.unit.profiles.test_calibrate_learned import _tiny_settings, _write_data


def test_packet_fit_lowers_the_kl_resumes_and_the_pipeline_carries_it(
    tiny_checkpoints, tmp_path, capsys
):
    settings, config_path = _tiny_settings(tiny_checkpoints, tmp_path)
    data = tmp_path / "data"
    _write_data(data)
    output = tmp_path / "profile.json"
    argv = [
        "--config",
        str(config_path),
        "calibrate",
        "--packet",
        "--packet-variant",
        "bridge",
        "--dataset",
        "musique",
        "hotpotqa",
        "--data-dir",
        str(data),
        "--questions",
        "5",
        "--max-new-tokens",
        "3",
        "--packet-tokens",
        "2",
        "--learning-rate",
        "0.5",
        "--records",
        str(tmp_path / "records"),
        "--output",
        str(output),
    ]
    assert main([*argv, "--epochs", "1"]) == 0
    assert main([*argv, "--epochs", "4"]) == 0  # three more passes after the checkpoint
    printed = capsys.readouterr().out
    assert "resumed after pass 1" in printed
    profile = ModelProfile.read(output.parent, output.name)
    packet = profile.packet
    assert packet is not None and packet.bridge_tokens == 2 and packet.epochs == 4
    assert len(packet.loss_curve) == 2 + 4  # no packet, the starting rows, then each pass
    assert packet.loss_curve[-1] < packet.loss_curve[1]  # training lowered the KL
    assert (output.parent / packet.file).read_bytes() == profile.packet_bytes
    assert packet.digest[:12] in packet.file

    # the pipeline of that model reads the profile from its home and carries the bridge
    rag = _pipeline_reading(settings, output, packet.file)
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    prefilled = rag.augmentation.looked_up_prefill(layout, 0)
    assert len(prefilled.layout.query_ids) == len(layout.query_ids) + 2


def test_a_trailer_fit_lowers_the_kl_and_names_its_rows(tiny_checkpoints, tmp_path):
    _, config_path = _tiny_settings(tiny_checkpoints, tmp_path)
    data = tmp_path / "data"
    _write_data(data)
    output = tmp_path / "profile.json"
    argv = ["--config", str(config_path), "calibrate", "--packet", "--packet-variant", "trailer"]
    argv += ["--dataset", "musique", "--data-dir", str(data), "--questions", "5"]
    argv += ["--max-new-tokens", "3", "--packet-tokens", "2", "--learning-rate", "0.5"]
    assert main([*argv, "--epochs", "3", "--output", str(output)]) == 0
    packet = ModelProfile.read(output.parent, output.name).packet
    assert packet is not None and (packet.bridge_tokens, packet.trailer_tokens) == (0, 2)
    assert packet.loss_curve[-1] < packet.loss_curve[1]


def test_a_replacing_bridge_starts_as_the_prompt_was_and_stands_in_for_its_tokens(
    tiny_checkpoints, tmp_path
):
    settings, config_path = _tiny_settings(tiny_checkpoints, tmp_path)
    data = tmp_path / "data"
    _write_data(data)
    output = tmp_path / "profile.json"
    argv = ["--config", str(config_path), "calibrate", "--packet", "--packet-variant", "replace"]
    argv += ["--dataset", "musique", "hotpotqa", "--data-dir", str(data), "--questions", "6"]
    argv += ["--max-new-tokens", "3", "--packet-tokens", "2", "--learning-rate", "0.005"]
    argv += ["--ratio", "0"]  # chunks reused as they are: the reused path's KL is the largest
    assert main([*argv, "--epochs", "3", "--output", str(output)]) == 0
    packet = ModelProfile.read(output.parent, output.name).packet
    assert packet is not None and packet.trailer_tokens == 0
    assert packet.bridge_tokens == len(packet.bridge_replaces) >= 1
    # the starting rows are the replaced tokens' embeddings: the KL starts at the reused path's
    no_packet, starting, *passes = packet.loss_curve
    assert abs(starting - no_packet) <= 1e-4 * max(no_packet, 1e-3)
    assert passes[-1] < starting

    rag = _pipeline_reading(settings, output, packet.file)
    layout = rag.prompts.layout(QUESTION, CHUNKS)
    assert layout.query_ids[: packet.bridge_tokens] == packet.bridge_replaces
    query = rag.augmentation.looked_up_prefill(layout, 0).layout.query_ids
    # the same length: the packet ids took the place of the template's opening ids
    assert len(query) == len(layout.query_ids)
    assert all(token >= rag.engine.spec.vocab_size for token in query[: packet.bridge_tokens])
    assert query[packet.bridge_tokens :] == layout.query_ids[packet.bridge_tokens :]


def _pipeline_reading(settings: dict, output, packet_file: str) -> AdaRAG:
    """The tiny model's pipeline, asking for the packet, with the fitted profile in its home."""
    rag = AdaRAG(AdaRagConfig.build(**settings, cache=ASKED))
    home_profiles = rag.config.home / "profiles"
    home_profiles.mkdir(parents=True, exist_ok=True)
    (home_profiles / packet_file).write_bytes((output.parent / packet_file).read_bytes())
    (home_profiles / f"{rag.engine.fingerprint}.json").write_text(output.read_text())
    rag.warm(list(CHUNKS))
    return rag
