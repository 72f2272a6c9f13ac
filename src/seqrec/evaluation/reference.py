"""Published numbers on ML-1M, with the protocol each was measured under.

Used to print our results beside the papers'; never used to compute anything.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PAPER_BASELINES_ML1M",
    "PAPER_BASELINES_ML1M_UNI100",
    "PAPER_ROWS",
    "PAPER_ROWS_BEAUTY",
    "PUBLISHED",
    "is_papers_ml1m",
    "paper_table",
    "published_numbers",
]


# (model, protocol) -> (source, {metric: value})
def is_papers_ml1m(stats: dict[str, Any]) -> bool:
    """Whether a dataset's stats are the papers' ML-1M (6,040 users, 3,416 items): where the
    papers' ML-1M rows may stand beside a result."""
    return stats.get("users") == 6040 and stats.get("items") == 3416


PAPER_ROWS: dict[tuple[str, str], tuple[str, dict[str, float]]] = {
    ("pop", "pop100"): (
        "BERT4Rec Table 2, POP, ML-1m",
        {
            "hr@1": 0.0141,
            "hr@5": 0.0715,
            "hr@10": 0.1358,
            "ndcg@5": 0.0416,
            "ndcg@10": 0.0621,
            "mrr": 0.0627,
        },
    ),
    ("pop", "uni100"): ("SASRec Table III, PopRec, ML-1M", {"hr@10": 0.4329, "ndcg@10": 0.2377}),
    ("bert4rec", "pop100"): (
        "BERT4Rec Table 2, BERT4Rec, ML-1m",
        {
            "hr@1": 0.2863,
            "hr@5": 0.5876,
            "hr@10": 0.6970,
            "ndcg@5": 0.4454,
            "ndcg@10": 0.4818,
            "mrr": 0.4254,
        },
    ),
    ("sasrec", "pop100"): (
        "BERT4Rec Table 2, SASRec, ML-1m",
        {
            "hr@1": 0.2351,
            "hr@5": 0.5434,
            "hr@10": 0.6629,
            "ndcg@5": 0.3980,
            "ndcg@10": 0.4368,
            "mrr": 0.3790,
        },
    ),
    ("sasrec", "uni100"): ("SASRec Table III, SASRec, ML-1M", {"hr@10": 0.8245, "ndcg@10": 0.5905}),
    ("sasrec+ce", "full"): ("SASRec+ (Klenitskiy & Vasilev 2023), ML-1M", {"ndcg@10": 0.1821}),
    ("sasrec+gbce", "full"): ("gSASRec (Petrov & Macdonald 2023), ML-1M", {"ndcg@10": 0.1726}),
}

# BERT4Rec Table 2, Beauty: model -> (source, {metric: value}), all under pop100.
_METRICS = ("hr@1", "hr@5", "hr@10", "ndcg@5", "ndcg@10", "mrr")
PAPER_ROWS_BEAUTY: dict[str, tuple[str, dict[str, float]]] = {
    model: (f"BERT4Rec Table 2, {label}, Beauty", dict(zip(_METRICS, values, strict=True)))
    for model, label, values in (
        ("pop", "POP", (0.0077, 0.0392, 0.0762, 0.0230, 0.0349, 0.0437)),
        ("sasrec", "SASRec", (0.0906, 0.1934, 0.2653, 0.1436, 0.1633, 0.1536)),
        ("bert4rec", "BERT4Rec", (0.0953, 0.2207, 0.3025, 0.1599, 0.1862, 0.1701)),
    )
}

# BERT4Rec Table 2, ML-1m, the baselines: model -> (source, {metric: value}), all under pop100.
PAPER_BASELINES_ML1M: dict[str, tuple[str, dict[str, float]]] = {
    model: (f"BERT4Rec Table 2, {label}, ML-1m", dict(zip(_METRICS, values, strict=True)))
    for model, label, values in (
        ("bpr-mf", "BPR-MF", (0.0914, 0.2866, 0.4301, 0.1903, 0.2365, 0.2009)),
        ("ncf", "NCF", (0.0397, 0.1932, 0.3477, 0.1146, 0.1640, 0.1358)),
        ("fpmc", "FPMC", (0.1386, 0.4297, 0.5946, 0.2885, 0.3439, 0.2891)),
        ("gru4rec", "GRU4Rec", (0.1583, 0.4673, 0.6207, 0.3196, 0.3627, 0.3041)),
        ("gru4rec+", "GRU4Rec+", (0.2092, 0.5103, 0.6351, 0.3705, 0.4064, 0.3462)),
        ("caser", "Caser", (0.2194, 0.5353, 0.6692, 0.3832, 0.4268, 0.3648)),
    )
}

# SASRec Table III, ML-1M, the baselines: model -> (source, {metric: value}), all under uni100.
PAPER_BASELINES_ML1M_UNI100: dict[str, tuple[str, dict[str, float]]] = {
    model: (f"SASRec Table III, {label}, ML-1M", {"hr@10": hr, "ndcg@10": ndcg})
    for model, label, hr, ndcg in (
        ("bpr-mf", "BPR", 0.5781, 0.3287),
        ("fmc", "FMC", 0.6986, 0.4676),
        ("fpmc", "FPMC", 0.7599, 0.5176),
        ("transrec", "TransRec", 0.6413, 0.3969),
        ("gru4rec", "GRU4Rec", 0.5581, 0.3381),
        ("gru4rec+", "GRU4Rec+", 0.7501, 0.5513),
        ("caser", "Caser", 0.7886, 0.5538),
    )
}


def paper_table(name: str) -> dict[str, dict[str, float]]:
    """A paper's results table as `seqrec reproduce` prints it beside ours: point label (the model
    key) -> {"protocol.metric": value}. "bert4rec-table2-ml1m": BERT4Rec Table 2's ML-1m rows
    (pop100); "sasrec-table3-ml1m": SASRec Table III's ML-1M rows (uni100)."""
    if name == "bert4rec-table2-ml1m":
        rows = {m: r for m, (_, r) in PAPER_BASELINES_ML1M.items()}
        rows |= {m: PAPER_ROWS[(m, "pop100")][1] for m in ("sasrec", "bert4rec")}
        protocol = "pop100"
    elif name == "sasrec-table3-ml1m":
        rows = {m: r for m, (_, r) in PAPER_BASELINES_ML1M_UNI100.items()}
        rows["sasrec"] = PAPER_ROWS[("sasrec", "uni100")][1]
        protocol = "uni100"
    else:
        raise KeyError(
            f"no paper table {name!r}; expected bert4rec-table2-ml1m, sasrec-table3-ml1m"
        )
    return {m: {f"{protocol}.{k}": v for k, v in r.items()} for m, r in rows.items()}


# Other published figures the docs cite beside ours, as printed -> where they come from.
PUBLISHED: dict[str, str] = {
    "0.1537": "BERT4Rec, full NDCG@10, ML-1M (Klenitskiy & Vasilev, RecSys 2023)",
    "0.1618": "RecTools BERT4Rec, full NDCG@10, ML-1M (RecTools benchmark)",
    "0.4631": "BERT4Rec Table 4, N = 10, ML-1m, NDCG@10 (pop100)",
    "1,409": "BERT4Rec training seconds on a GPU, ML-1M (Klenitskiy & Vasilev, RecSys 2023)",
    "0.0327": "SASRec+, full NDCG@10, Beauty (Klenitskiy & Vasilev, RecSys 2023)",
    "0.0187": "BERT4Rec, full NDCG@10, Beauty (Klenitskiy & Vasilev, RecSys 2023)",
    "0.1930": "LRURec, full NDCG@10, ML-1M (Yue et al., WSDM 2024)",
    "0.1902": "SASRec trained with cross-entropy, full NDCG@10, ML-1M (Yue et al., WSDM 2024)",
    "0.1857": "SASRec+ with 3,000 negatives, full NDCG@10, the BERT4Rec authors' ML-1M file "
    "(Klenitskiy & Vasilev, RecSys 2023)",
    "0.3219": "SASRec Table III, SASRec, NDCG@10 (uni100), Beauty (SASRec's own preprocessing)",
    "0.1720": "HSTU, full NDCG@10, ML-1M, HSTU's preprocessing (Zhai et al., ICML 2024)",
    "0.1893": "HSTU-large, full NDCG@10, ML-1M, HSTU's preprocessing (Zhai et al., ICML 2024)",
    "0.1979": "HSTU-large with Mixture-of-Logits, full NDCG@10, ML-1M, HSTU's preprocessing "
    "(Ding & Zhai, Retrieval with Learned Similarities)",
}


def published_numbers() -> set[str]:
    """Every published number the docs may quote without a results file, as printed ("0.4818")."""
    out = set(PUBLISHED)
    for _, row in [
        *PAPER_ROWS.values(),
        *PAPER_ROWS_BEAUTY.values(),
        *PAPER_BASELINES_ML1M.values(),
        *PAPER_BASELINES_ML1M_UNI100.values(),
    ]:
        out.update(f"{v:.4f}" for v in row.values())
    return out
