"""Uncertainty routing on the fidelity questions: who is routed up, and what it keeps.

``experimental.recompute.uncertain_entropy = H`` runs the query suffix over the reused KV before the
fused prefill and, when the entropy of its next-token distribution is above ``H`` nats,
recomputes the request at ``uncertain_ratio`` (1.0: a full prefill) instead of its own ratio.
A routed request is exactly a request at the higher ratio (the engine's tests show the same
positions, and ratio 1.0 equals full prefill), so its quality comes from the fidelity rows
already measured: this script only measures each question's entropy over the reused KV
(``--measure``: the ratio-0 prefill's next-token distribution, what the query pass computes),
written per question to ``<model>/<dataset>.entropy.jsonl`` beside the fidelity rows, so a run
resumes.

The report chooses ``H`` on the calibration split (the largest threshold on a 0.05 grid whose
routed policy keeps ``--target`` % exact agreement with full recomputation, pooled) and applies
it to the report split, per data set and pooled, with 95% bootstrap intervals; the routed
policy's rows are named ``<rule>+routed<H>``. Its cost is the share of requests routed up;
``--speed`` reads an ``engine_ttft.py`` result with variants ``kept`` (routing on, not routed),
``routed`` (routed up) and ``full`` and turns the share into a mean TTFT speed-up.

    python benchmarks/uncertainty_routing.py --model qwen2.5-coder-0.5b --measure
    python benchmarks/uncertainty_routing.py --model qwen2.5-coder-0.5b \\
        --speed results/engine_ttft_routing_qwen.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from common import DEFAULT_DATA_DIR, RESULTS
from fidelity import _model_name
from fidelity_tables import by_dataset

from adarag.evaluation.fidelity import FidelityRow, contains_gold, read_rows, summarize
from adarag.evaluation.intervals import paired_difference
from adarag.evaluation.metrics import best_exact_match
from adarag.evaluation.workload import DATASETS, FIDELITY_CHUNKS, load_questions

SPLITS = {  # split -> (folder under results/fidelity, offset, rule of its query_deviation rows)
    "calibration": ("calibration", 0, "qdev"),
    "report": ("", 40, "query_deviation"),
}
QUESTIONS = {"calibration": 8, "report": 40}
SMOLLM2_REPORT_QUESTIONS = 60
GRID = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--dataset", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--measure", action="store_true", help="measure missing entropies")
    parser.add_argument("--split", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    parser.add_argument("--ratio", type=float, default=0.2, help="the requests' own ratio")
    parser.add_argument("--target", type=float, default=85.0, help="calibration's exact agree %")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--speed", type=Path, help="an engine_ttft.py result (.json)")
    parser.add_argument("--output", default="uncertainty_routing", help="results/<output>.md")
    args = parser.parse_args()
    model = _model_name(args.model)
    if args.measure:
        _measure(args, model)
    _report(args, model)


def folder(split: str, model: str) -> Path:
    """Where a split's fidelity rows (and entropies) of ``model`` are."""
    return RESULTS / "fidelity" / SPLITS[split][0] / model


def read_entropies(split: str, model: str) -> dict[tuple[str, str], float]:
    """(dataset, qid) -> entropy over the reused KV, for every question measured."""
    found = {}
    for path in sorted(folder(split, model).glob("*.entropy.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                found[(record["dataset"], record["qid"])] = record["entropy"]
    return found


def _questions(args: argparse.Namespace, split: str, model: str, dataset: str) -> list:
    """The split's questions of ``dataset`` (the fidelity runs' counts and offsets)."""
    count = QUESTIONS[split]
    if split == "report" and "SmolLM2" in model:
        count = SMOLLM2_REPORT_QUESTIONS
    chunks = FIDELITY_CHUNKS[dataset]
    return load_questions(dataset, args.data_dir, count, chunks, SPLITS[split][1])


def _measure(args: argparse.Namespace, model: str) -> None:
    from adarag import AdaRAG
    from adarag.evaluation.reuse import independent_chunks, reuse_sources
    from adarag.kernels import lens_signals_from_logits
    from adarag.schema import GenerationParams

    engine: dict = {"model": args.model}
    if args.threads:
        engine["num_threads"] = args.threads
    rag = AdaRAG(engine=engine)
    engine = rag.engine
    params = GenerationParams(max_new_tokens=16)
    for split in args.split:
        done = read_entropies(split, model)
        for dataset in args.dataset:
            path = folder(split, model) / f"{dataset}.entropy.jsonl"
            for item in _questions(args, split, model, dataset):
                if (dataset, item.qid) in done:
                    continue
                layout = rag.layout(item.question, item.chunks, params)
                system_kv, chunk_kvs = independent_chunks(engine, layout)
                reused = engine.prefill(layout, reuse_sources(system_kv, chunk_kvs, 0.0))
                entropy = float(lens_signals_from_logits(reused.logits[None])[1])
                record = {"dataset": dataset, "qid": item.qid, "entropy": entropy}
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                print(f"{model} {split} {dataset} {item.qid}: {entropy:.3f}")


@dataclass(frozen=True)
class Split:
    """One split's fidelity rows, entropies over the reused KV and gold answers.

    Attributes:
        rows: Every fidelity row of the split (every rule and ratio).
        entropies: (dataset, qid) -> next-token entropy over the reused KV, in nats.
        answers: (dataset, qid) -> the gold answers.
        rule: The name of the split's ``query_deviation`` rows.
    """

    rows: list[FidelityRow]
    entropies: dict[tuple[str, str], float]
    answers: dict[tuple[str, str], list[str]]
    rule: str

    def alone(self, ratio: float) -> list[FidelityRow]:
        """The rule's rows at ``ratio`` on the questions whose entropy was measured."""
        return [
            r
            for r in self.rows
            if r.rule == self.rule and r.ratio == ratio and (r.dataset, r.qid) in self.entropies
        ]

    def routed(self, ratio: float, threshold: float) -> list[FidelityRow]:
        """The routed policy's rows: the rule at ``ratio``, or full recomputation when uncertain."""
        name = routed_name(self.rule, threshold)
        policy = []
        for row in self.alone(ratio):
            key = (row.dataset, row.qid)
            if self.entropies[key] <= threshold:
                policy.append(replace(row, rule=name))
                continue
            golds = self.answers[key]
            policy.append(
                replace(
                    row,
                    rule=name,
                    answer=row.reference,
                    exact_agreement=1.0,
                    f1_agreement=1.0,
                    first_token_agreement=1.0,
                    first_token_kl=0.0,
                    gold_em=best_exact_match(row.reference, golds),
                    gold_f1=row.reference_gold_f1,
                    gold_contains=contains_gold(row.reference, golds),
                    ttft_s=row.full_ttft_s,
                    num_recomputed_tokens=row.num_prompt_tokens,
                )
            )
        return policy

    def threshold(self, ratio: float, target: float) -> float | None:
        """The largest threshold on the grid whose routed rows keep ``target`` % exact agreement."""
        best = None
        for step in range(1, int(max(self.entropies.values(), default=0.0) / GRID) + 2):
            threshold = round(step * GRID, 4)
            found = summarize(self.routed(ratio, threshold), intervals=False)
            if found and found[0].exact_agreement >= target:
                best = threshold
        return best


def routed_name(rule: str, threshold: float) -> str:
    """The name of the routed policy's rows (and of the routed rule decoded for real)."""
    return f"{rule}+routed{threshold:g}"


def _split(args: argparse.Namespace, split: str, model: str) -> Split:
    rows = [
        row
        for path in sorted(folder(split, model).glob("*.rows.jsonl"))
        for row in read_rows(path)
        if row.dataset in args.dataset
    ]
    answers = {
        (dataset, item.qid): list(item.answers)
        for dataset in args.dataset
        for item in _questions(args, split, model, dataset)
    }
    return Split(rows, read_entropies(split, model), answers, SPLITS[split][2])


def _report(args: argparse.Namespace, model: str) -> None:
    """``results/<output>_<model>.md``: the threshold, calibration and report tables."""
    splits = {split: _split(args, split, model) for split in SPLITS}
    threshold = splits["calibration"].threshold(args.ratio, args.target)
    if threshold is None:
        print(f"{model}: no threshold keeps {args.target}% on the calibration split")
        return
    lines = [
        f"# Uncertainty routing: {model}",
        "",
        f"Requests at ratio {args.ratio} under `query_deviation`; a request whose next-token "
        f"entropy over the reused KV is above H is recomputed in full. H = {threshold:g} nats, "
        f"the largest threshold (grid {GRID}) keeping {args.target:g}% exact agreement with full "
        "recomputation on the calibration split, pooled. Means with 95% bootstrap intervals; "
        "'paired' is the routed policy minus the rule alone on the same questions; 'same share "
        "routed at random' is the exact agreement expected from routing as many requests up "
        "without reading the entropy (the control).",
        "",
    ]
    speed = _speeds(args.speed) if args.speed else None
    for name, split in splits.items():
        ratios = (0.1, 0.2, 0.3) if name == "calibration" else (args.ratio,)
        lines += [
            f"## {name.capitalize()} split",
            "",
            "| data set | ratio | n | routed % | exact agree: rule | exact agree: routed "
            "| paired | same share routed at random | first-token agree: routed "
            "| gold F1 - full: routed | mean TTFT speed-up |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for ratio in ratios:
            policy, alone = split.routed(ratio, threshold), split.alone(ratio)
            timed = speed if ratio == args.ratio else None  # the ratio engine_ttft timed
            for dataset, subset in by_dataset(policy) if policy else ():
                same_set = [r for r in alone if dataset in ("pooled", r.dataset)]
                lines.append(_line(dataset, ratio, subset, same_set, timed))
        lines += [
            "",
            f"AUC of the entropy for the rule's disagreements at {args.ratio} (1.0: every "
            "disagreeing question above every agreeing one; 0.5: chance): "
            f"{_auc(split.alone(args.ratio), split.entropies):.2f}.",
            "",
            *_decoded_for_real(split, args.ratio, threshold),
        ]
    text = "\n".join(lines)
    print(text)
    (RESULTS / f"{args.output}_{model}.md").write_text(text + "\n")


def _auc(rows: list[FidelityRow], entropies: dict[tuple[str, str], float]) -> float:
    """P(a disagreeing question's entropy > an agreeing one's), ties counting half."""
    measured = [r for r in rows if (r.dataset, r.qid) in entropies]
    wrong = [entropies[(r.dataset, r.qid)] for r in measured if not r.exact_agreement]
    right = [entropies[(r.dataset, r.qid)] for r in measured if r.exact_agreement]
    if not wrong or not right:
        return float("nan")
    wins = sum((w > a) + 0.5 * (w == a) for w in wrong for a in right)
    return wins / (len(wrong) * len(right))


def _decoded_for_real(split: Split, ratio: float, threshold: float) -> list[str]:
    """How often the rows the routed rule decoded for real equal the policy built here."""
    built = {(r.dataset, r.qid): r for r in split.routed(ratio, threshold)}
    name = routed_name(split.rule, threshold)
    real = [r for r in split.rows if r.rule == name and r.ratio == ratio]
    if not real:
        return []
    same = sum(
        r.answer == built[(r.dataset, r.qid)].answer for r in real if (r.dataset, r.qid) in built
    )
    uncertain = [r for r in real if split.entropies.get((r.dataset, r.qid), 0.0) > threshold]
    # a request routed up recomputes every token but the system prefix's
    recomputed = sum(r.num_recomputed_tokens > 0.8 * r.num_prompt_tokens for r in uncertain)
    return [
        f"Decoded for real (`fidelity.py --rule '{name}:selection_policy="
        f"query_deviation,uncertain_entropy={threshold:g}'`): {len(real)} questions, "
        f"{len(uncertain)} above H, of which {recomputed} recomputed more than 80% of the prompt; "
        f"the answer equals the policy built above on {same} of {len(real)}.",
        "",
    ]


def _line(
    dataset: str,
    ratio: float,
    policy: list[FidelityRow],
    alone: list[FidelityRow],
    speed: dict[str, float] | None,
) -> str:
    routed_share = sum(r.num_recomputed_tokens == r.num_prompt_tokens for r in policy) / len(policy)
    found = summarize(policy)[0]
    base = summarize(alone)[0]
    paired = paired_difference(
        [100 * r.exact_agreement for r in policy], [100 * r.exact_agreement for r in alone]
    )
    # routing the same share of requests up at random: a routed one agrees, the rest as before
    at_random = base.exact_agreement + routed_share * (100.0 - base.exact_agreement)
    ttft = "-"
    if speed is not None:
        mean = (1 - routed_share) * speed["kept"] + routed_share * speed["routed"]
        ttft = f"{speed['full'] / mean:.2f}x"
    return (
        f"| {dataset} | {ratio} | {found.num_questions} | {100 * routed_share:.1f} "
        f"| {base.exact_interval} | {found.exact_interval} | {paired} | {at_random:.1f} "
        f"| {found.first_token_interval} | {found.gold_f1_vs_full} | {ttft} |"
    )


def _speeds(path: Path) -> dict[str, float]:
    """Mean TTFT of ``full``, the ``kept`` and the ``routed`` variants of an engine_ttft run."""
    stats = json.loads(path.read_text())["stats"]
    found = {"full": stats["full"]["mean"]}
    for name, stat in stats.items():
        for variant in ("kept", "routed"):
            if name.endswith(f" {variant}"):
                found[variant] = stat["mean"]
    return found


if __name__ == "__main__":
    main()
