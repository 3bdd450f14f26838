"""The selector's labels are taken on the path it runs on: with the pipeline's bridge, apart."""

from __future__ import annotations

import torch

from adarag.engine.prefill_request import LearnedControls
from adarag.evaluation.profiling.selector_labels import (
    label_question,
    labelling_bridge,
    packet_folder,
)
from adarag.evaluation.workload import BenchQuestion
from adarag.pipeline import AdaRAG
from adarag.schema import GenerationParams
from tests.unit.engine.helpers import CHUNKS, QUESTION
from tests.unit.pipeline.packet_profile import ASKED, with_packet

PARAMS = GenerationParams(max_new_tokens=4)
ITEM = BenchQuestion("q0", QUESTION, ("Paris",), tuple(CHUNKS))


def test_labels_carry_the_bridge_and_live_apart(tiny_checkpoints, tiny_config, tmp_path):
    rag = AdaRAG(tiny_config(tiny_checkpoints["llama"], cache=ASKED))
    assert labelling_bridge(rag) == LearnedControls()
    assert packet_folder(tmp_path, rag) == tmp_path  # no packet: the folder as it was
    with_packet(rag, rows=3, trailer=2)
    rag = AdaRAG(rag.config)  # reads the profile with the packet
    bridge = labelling_bridge(rag)
    assert bridge.bridge_tokens == 3 and bridge.trailer_tokens == 0  # the trailer is not carried
    assert packet_folder(tmp_path, rag).name == f"packet-{bridge.packet_digest[:12]}"
    off = rag.with_config(cache={"recompute": {"packet": "off"}})
    assert labelling_bridge(off) == LearnedControls() and packet_folder(tmp_path, off) == tmp_path

    plain = label_question(rag, "tiny", ITEM, PARAMS)
    bridged = label_question(rag, "tiny", ITEM, PARAMS, bridge=bridge)
    assert plain.reference == bridged.reference  # full recomputation carries no packet
    assert torch.equal(plain.positions, bridged.positions)  # the same chunk tokens compete
    assert not torch.allclose(plain.features, bridged.features)
    assert not torch.allclose(plain.gain, bridged.gain)
