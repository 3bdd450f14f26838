"""Greedy answers of our engine's decoder against transformers' ``generate`` on the same prompts.

A check of the decoding path's quality, independent of the cache: a full prefill of each prompt
(musique questions from ``--offset`` with their first ``--passages`` passages), then
up to ``--new-tokens`` greedy steps, to the end-of-sequence token, by our runner and by
transformers; reported: the share of answers equal token for token, the first step where they
differ, and the first-step logits' largest difference.

    python benchmarks/decode_agreement.py --model default --output decode_agreement_smollm2
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import machine, musique_prompts, write_results
from transformers import AutoModelForCausalLM

from adarag import AdaRAG
from adarag.engine.core import eos_token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--passages", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--output", default="decode_agreement")
    args = parser.parse_args()

    rag = AdaRAG(engine={"model": args.model})
    engine = rag.engine
    hf_model = AutoModelForCausalLM.from_pretrained(engine.checkpoint.path, dtype=torch.float32)
    hf_model.eval()
    eos = set(eos_token_ids(engine.checkpoint))
    rows = []
    prompts = musique_prompts(rag, args.data_dir, args.questions, args.passages)
    with torch.inference_mode():
        for row, layout, _, _ in prompts:
            prefill = engine.prefill(layout, max_new_tokens=args.new_tokens)
            ours = [int(prefill.logits.argmax())]
            while len(ours) < args.new_tokens and ours[-1] not in eos:
                ours.append(int(engine.runner.decode(ours[-1], prefill.kv).argmax()))
            ids = torch.tensor([layout.token_ids])
            generated = hf_model.generate(
                ids,
                max_new_tokens=args.new_tokens,
                do_sample=False,
                eos_token_id=sorted(eos),
                output_logits=True,
                return_dict_in_generate=True,
            )
            theirs = generated.sequences[0, ids.shape[1] :].tolist()
            first_gap = float((generated.logits[0][0] - prefill.logits).abs().max())
            ours, theirs = _until_eos(ours, eos), _until_eos(theirs, eos)
            differs = next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None
            )
            rows.append(
                {
                    "id": row["id"],
                    "tokens": layout.num_tokens,
                    "equal": ours == theirs,
                    "first_difference": differs,
                    "first_logits_max_abs_diff": first_gap,
                    "ours": ours,
                    "transformers": theirs,
                }
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
    )


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The answer's tokens: up to the first end-of-sequence token, excluded."""
    ends = [idx for idx, token in enumerate(tokens) if token in eos]
    return tokens[: ends[0]] if ends else tokens


if __name__ == "__main__":
    main()
