"""Plain-text / Markdown tables of evaluation results."""

from __future__ import annotations

from collections.abc import Mapping

from seqrec.evaluation.reference import PAPER_ROWS

__all__ = ["metrics_table", "run_label", "stats_table"]

# each model's loss in its paper: a run with another loss is labelled "<model>+<loss>", so the
# paper's row is printed beside the run only when the run is the paper's model
PAPER_LOSS = {"bert4rec": "ce", "sasrec": "bce"}


def run_label(model: str, loss: str) -> str:
    """ "sasrec" for the paper's SASRec, "sasrec+ce" for SASRec trained with CE, and so on."""
    return model if PAPER_LOSS.get(model) == loss else f"{model}+{loss}"


def metrics_table(
    results: Mapping[str, Mapping[str, float]],
    *,
    model: str | None = None,
    with_paper: bool = False,
) -> str:
    """A Markdown table, one row per protocol (and the paper's row under it when known)."""
    metrics = list(dict.fromkeys(m for row in results.values() for m in row))
    head = ["protocol", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for protocol, row in results.items():
        name = f"{model} {protocol}" if model else protocol
        lines.append("| " + " | ".join([name, *(f"{row[m]:.4f}" for m in metrics)]) + " |")
        if with_paper and model and (model, protocol) in PAPER_ROWS:
            source, paper = PAPER_ROWS[(model, protocol)]
            cells = [f"{paper[m]:.4f}" if m in paper else "" for m in metrics]
            lines.append("| " + " | ".join([f"paper: {source}", *cells]) + " |")
    return "\n".join(lines)


def stats_table(name: str, stats: Mapping[str, float | int]) -> str:
    """BERT4Rec's Table 1 row."""
    return "\n".join(
        [
            "| dataset | #users | #items | #actions | avg. length | density |",
            "|---|---|---|---|---|---|",
            f"| {name} | {stats['users']:,} | {stats['items']:,} | {stats['actions']:,} | "
            f"{stats['avg_length']:.1f} | {100 * float(stats['density']):.2f}% |",
        ]
    )
