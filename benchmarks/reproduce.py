"""The papers' tables and their recipes reproduced on the papers' files.

    python benchmarks/reproduce.py SUBCOMMAND [--help] [ARGS]

Subcommands (each a module of benchmarks/suite; its docstring says what it measures and how):

    bert4rec-ml1m          BERT4Rec on the papers' ML-1M file beside Table 2
    sasrec-ml1m            SASRec with each loss on the papers' ML-1M file
    lrurec-ml1m            LRURec's recipe on the papers' ML-1M file under a budget
    baselines-ml1m         the papers' baselines on their ML-1M file
    beauty                 Beauty end to end: POP, SASRec, SASRec+CE, BERT4Rec
    pop-ml1m               POP on the papers' ML-1M file beside both papers' rows
    pop-beauty             POP and Table 1's row on the authors' Beauty file
    ensemble               an ensemble of trained recipes against its members
    seed-confirmation      a close call confirmed with more training seeds
"""

from __future__ import annotations

from _common import run_suite

COMMANDS = {
    "bert4rec-ml1m": "bert4rec_ml1m",
    "sasrec-ml1m": "sasrec_ml1m",
    "lrurec-ml1m": "lrurec_ml1m",
    "baselines-ml1m": "baselines_ml1m",
    "beauty": "beauty",
    "pop-ml1m": "pop_ml1m",
    "pop-beauty": "pop_beauty",
    "ensemble": "ensemble",
    "seed-confirmation": "seed_confirmation",
}

if __name__ == "__main__":
    run_suite(__doc__, COMMANDS)
