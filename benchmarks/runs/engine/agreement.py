"""``engine.py agreement``: greedy answers of our decoder against transformers' ``generate``."""

from __future__ import annotations

import argparse

import torch
from common import machine, musique_prompts, write_results
from transformers import AutoModelForCausalLM

from adarag import AdaRAG
from adarag.engine.core import Engine, eos_token_ids
from adarag.engine.prefill_request import PrefillRequest
from adarag.schema import PromptLayout
from runs.engine import OUTPUT


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The answer's tokens: up to the first end-of-sequence token, excluded."""
    ends = [idx for idx, token in enumerate(tokens) if token in eos]
    return tokens[: ends[0]] if ends else tokens


def decode_agreement(args: argparse.Namespace) -> None:
    """The ``agreement`` subcommand."""

    rag = AdaRAG(engine={"model": args.model})
    engine = rag.engine
    hf_model = AutoModelForCausalLM.from_pretrained(engine.checkpoint.path, dtype=torch.float32)
    hf_model.eval()
    eos = set(eos_token_ids(engine.checkpoint))
    rows = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    with torch.inference_mode():
        for row, layout, _, _ in prompts:
            rows.append(
                {"id": row["id"], **_compare(engine, hf_model, layout, args.new_tokens, eos)}
            )
            print(rows[-1])
    equal = sum(r["equal"] for r in rows)
    info = machine()
    table = "\n".join(
        [
            f"Decode agreement, {engine.checkpoint.path.name}: {len(rows)} musique prompts x "
            f"{args.passages} passages, up to {args.new_tokens} greedy tokens, ours vs "
            "transformers.",
            f"Machine: {info['cpu']}, {info['cores']} cores, torch {torch.__version__}.",
            "",
            f"answers equal token for token: {equal} of {len(rows)}; largest first-step logit "
            f"difference: {max(r['first_logits_max_abs_diff'] for r in rows):.2e}",
        ]
    )
    print(table)
    write_results(
        args.output,
        {"machine": info, "args": vars(args) | {"data_dir": str(args.data_dir)}, "rows": rows},
        table,
        directory=OUTPUT,
    )


def _compare(
    engine: Engine,
    hf_model: torch.nn.Module,
    layout: PromptLayout,
    new_tokens: int,
    eos: set[int],
) -> dict:
    """One prompt's greedy answers, ours and transformers', and where they differ."""
    prefill = engine.prefill(PrefillRequest(layout, max_new_tokens=new_tokens))
    ours = [int(prefill.logits.argmax())]
    while len(ours) < new_tokens and ours[-1] not in eos:
        ours.append(int(engine.runner.decode(ours[-1], prefill.kv).argmax()))
    ids = torch.tensor([layout.token_ids])
    generated = hf_model.generate(
        ids,
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos),
        output_logits=True,
        return_dict_in_generate=True,
    )
    theirs = generated.sequences[0, ids.shape[1] :].tolist()
    first_gap = float((generated.logits[0][0] - prefill.logits).abs().max())
    ours, theirs = _until_eos(ours, eos), _until_eos(theirs, eos)
    differs = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    return {
        "tokens": layout.num_tokens,
        "equal": ours == theirs,
        "first_difference": differs,
        "first_logits_max_abs_diff": first_gap,
        "ours": ours,
        "transformers": theirs,
    }
