"""Runs inside the peers' virtual environment (benchmarks/peers.py creates it): trains one
peer library's BERT4Rec or SASRec on the papers' ML-1M file for a fixed wall-clock window and
prints one JSON line with its training speed. Imports nothing from seqrec.

    python peers_worker.py {recbole,rectools} {bert4rec,sasrec} ML_1M_TXT_GZ
        [--seconds 120] [--d 64] [--layers 2] [--heads 2] [--max-len 200] [--batch 128]
        [--dropout 0.2] [--mask-prob 0.2] [--threads 2] [--workdir DIR]

Both libraries get the training part of the leave-one-out split (each user's last two items held
out), matched sizes, full-softmax cross-entropy, and the same threads.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def read_train(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user, item, order) of the papers' file, each user's last two interactions removed."""
    with gzip.open(path, "rt") as f:
        pairs = np.loadtxt(f, dtype=np.int64)
    users, items = pairs[:, 0], pairs[:, 1]
    order = np.arange(len(users))  # the file is in time order within each user
    last = np.r_[users[1:] != users[:-1], True]  # the last row of each user
    second = np.r_[last[1:], False]
    keep = ~(last | second)
    return users[keep], items[keep], order[keep]


def rectools(args: argparse.Namespace) -> dict[str, Any]:
    import pandas as pd
    from pytorch_lightning import Callback, Trainer
    from rectools import Columns
    from rectools.dataset import Dataset
    from rectools.models import BERT4RecModel, SASRecModel
    from rectools.models.nn.item_net import IdEmbeddingsItemNet

    users, items, order = read_train(args.data)
    df = pd.DataFrame(
        {
            Columns.User: users,
            Columns.Item: items,
            Columns.Weight: 1.0,
            Columns.Datetime: pd.to_datetime(order, unit="s"),
        }
    )
    dataset = Dataset.construct(df)
    timing: dict[str, Any] = {"batches": 0, "seqs": 0, "start": None}

    class Clock(Callback):  # type: ignore[misc]
        """Counts training batches and stops the run after the window."""

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            if timing["start"] is None and idx == 2:  # after two warm-up batches
                timing["start"] = time.perf_counter()

        def on_train_batch_end(
            self, trainer: Any, module: Any, out: Any, batch: Any, idx: int
        ) -> None:
            if timing["start"] is None:
                return
            timing["batches"] += 1
            timing["seqs"] += int(batch["x"].shape[0])
            timing["elapsed"] = time.perf_counter() - timing["start"]
            if timing["elapsed"] > args.seconds:
                trainer.should_stop = True

    def trainer() -> Trainer:
        return Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[Clock()],
        )

    common = dict(
        n_blocks=args.layers,
        n_heads=args.heads,
        n_factors=args.d,
        dropout_rate=args.dropout,
        session_max_len=args.max_len,
        loss="softmax",
        batch_size=args.batch,
        epochs=1,
        item_net_block_types=(IdEmbeddingsItemNet,),
        get_trainer_func=trainer,
    )
    if args.model == "bert4rec":
        model: Any = BERT4RecModel(mask_prob=args.mask_prob, **common)
    else:
        model = SASRecModel(**common)
    model.fit(dataset)
    rate = timing["seqs"] / timing["elapsed"]
    n_sessions = int(df[Columns.User].nunique())  # one training session per user and epoch
    return {
        "seq_per_s": rate,
        "samples_per_epoch": n_sessions,
        "s_per_epoch": n_sessions / rate,
        "batches_timed": timing["batches"],
        "seconds_timed": timing["elapsed"],
    }


def recbole(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.model.sequential_recommender import BERT4Rec, SASRec
    from recbole.utils import init_seed

    root = Path(args.workdir or tempfile.mkdtemp(prefix="recbole-"))
    (root / "ml1m").mkdir(parents=True, exist_ok=True)
    # the whole file: RecBole's own leave-one-out split ("LS") holds out each user's last two
    with gzip.open(args.data, "rt") as f:
        full = np.loadtxt(f, dtype=np.int64)
    with open(root / "ml1m" / "ml1m.inter", "w") as f:
        f.write("user_id:token\titem_id:token\ttimestamp:float\n")
        for i, (u, it) in enumerate(full):
            f.write(f"{u}\t{it}\t{i}\n")
    name = "BERT4Rec" if args.model == "bert4rec" else "SASRec"
    config = Config(
        model=name,
        dataset="ml1m",
        config_dict={
            "data_path": str(root),
            "load_col": {"inter": ["user_id", "item_id", "timestamp"]},
            "MAX_ITEM_LIST_LENGTH": args.max_len,
            "hidden_size": args.d,
            "inner_size": 4 * args.d,
            "n_layers": args.layers,
            "n_heads": args.heads,
            "hidden_dropout_prob": args.dropout,
            "attn_dropout_prob": args.dropout,
            "mask_ratio": args.mask_prob,
            "loss_type": "CE",
            "train_neg_sample_args": None,
            "train_batch_size": args.batch,
            "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "mode": "full"},
            "device": "cpu",
            "use_gpu": False,
            "show_progress": False,
            "seed": 0,
            "reproducibility": False,
            "log_wandb": False,
        },
    )
    init_seed(config["seed"], config["reproducibility"])
    dataset = create_dataset(config)
    train_data, _, _ = data_preparation(config, dataset)
    model = (BERT4Rec if name == "BERT4Rec" else SASRec)(config, train_data.dataset)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    samples, start, batches = 0, None, 0
    elapsed = 0.0
    for i, interaction in enumerate(train_data):  # the loop of RecBole's Trainer._train_epoch
        if i == 2:
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = model.calculate_loss(interaction)
        loss.backward()
        optimizer.step()
        if start is not None:
            samples += len(interaction)
            batches += 1
            elapsed = time.perf_counter() - start
            if elapsed > args.seconds:
                break
    rate = samples / elapsed
    n_samples = len(train_data.dataset)  # RecBole: one sample per training prefix
    n_users = int(len(np.unique(full[:, 0])))
    return {
        "seq_per_s": rate,
        "samples_per_epoch": n_samples,
        "s_per_epoch": n_samples / rate,
        "users": n_users,
        "batches_timed": batches,
        "seconds_timed": elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("library", choices=["recbole", "rectools"])
    ap.add_argument("model", choices=["bert4rec", "sasrec"])
    ap.add_argument("data")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--mask-prob", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    result = (recbole if args.library == "recbole" else rectools)(args)
    result.update(
        {
            "library": args.library,
            "model": args.model,
            "version": _version(args.library),
            "torch": torch.__version__,
            "settings": {k: v for k, v in vars(args).items() if k not in ("library", "model")},
        }
    )
    print("RESULT " + json.dumps(result), flush=True)


def _version(library: str) -> str:
    from importlib.metadata import version

    return version(library)


if __name__ == "__main__":
    sys.exit(main())
