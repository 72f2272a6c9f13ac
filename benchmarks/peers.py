"""Training speed side by side with RecBole and RecTools, in one run on the same ML-1M file.

The peers live in their own virtual environment (created here on first use, torch pinned to
the project's 2.13.0; never project dependencies). Each peer model trains for a fixed
wall-clock window with sizes matched to ours (benchmarks/peers_worker.py); ours runs the same
shape through the real training step (benchmarks/speed.py throughput). The fair unit is the time of
one epoch, a pass over every training interaction as a target: RecTools and seqrec train one
sequence per user, RecBole one sample per prefix (about 160 times as many, one target each).

    python benchmarks/peers.py [--data-dir DIR] [--venv DIR] [--seconds 120]
        [--libraries recbole,rectools] [--models bert4rec,sasrec] [--name peers]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import paper_ml1m, write_results
from seqrec.config import RunConfig, load_config
from seqrec.data import download
from seqrec.data.prepare import prepare
from suite.throughput import measure

PEER_PACKAGES = ["torch==2.13.0", "recbole==1.2.1", "rectools[torch]==0.19.0"]
# our model -> (our shipped config, the worker's matched sizes)
MATCHED: dict[str, tuple[str, list[str]]] = {
    "bert4rec": (
        "ml-1m-bert4rec",
        ["--d", "64", "--layers", "2", "--heads", "2", "--dropout", "0.2", "--mask-prob", "0.2"],
    ),
    "sasrec": (
        "ml-1m-sasrec-ce",
        ["--d", "64", "--layers", "2", "--heads", "1", "--dropout", "0.1"],
    ),
}
COMMON = ["--max-len", "200", "--batch", "128", "--threads", "2"]


def ensure_venv(venv: Path) -> Path:
    """The peers' interpreter; the environment is created and filled on first use."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: never a CUDA build
        subprocess.run([*pip, *PEER_PACKAGES], check=True)
    return python


def run_peer(
    python: Path, library: str, model: str, data: Path, seconds: float, workdir: Path
) -> dict[str, Any]:
    worker = Path(__file__).with_name("peers_worker.py")
    cmd = [str(python), str(worker), library, model, str(data), "--seconds", str(seconds)]
    cmd += [*MATCHED[model][1], *COMMON, "--workdir", str(workdir / library)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 3 + 900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"library": library, "model": model, "error": " | ".join(tail)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--venv", help="the peers' environment (default: $SEQREC_HOME/peers-venv)")
    ap.add_argument("--seconds", type=float, default=120.0, help="timed window per peer model")
    ap.add_argument("--libraries", default="recbole,rectools")
    ap.add_argument("--models", default="bert4rec,sasrec")
    ap.add_argument("--name", default="peers")
    args = ap.parse_args()
    src = paper_ml1m(args.data_dir)
    home = download.cache_dir()
    python = ensure_venv(Path(args.venv) if args.venv else home / "peers-venv")
    rows: list[dict[str, Any]] = []
    for model in args.models.split(","):
        config = MATCHED[model][0]
        cfg = load_config(RunConfig, config)
        ds = prepare(src, data_cfg=cfg.data, eval_cfg=cfg.eval, progress=False)
        ours = measure(cfg, ds, steps=0, repeats=2, warmup=3)
        print(f"seqrec {model}: {ours['s_per_epoch']:.1f} s/epoch", flush=True)
        rows.append({"library": "seqrec", "model": model, "config": config, **ours})
        for library in args.libraries.split(","):
            peer = run_peer(python, library, model, src, args.seconds, home / "peers-work")
            if "s_per_epoch" in peer:
                peer["our_speedup"] = peer["s_per_epoch"] / ours["s_per_epoch"]
                print(f"{library} {model}: {peer['s_per_epoch']:.0f} s/epoch", flush=True)
            else:
                print(f"{library} {model}: failed: {peer['error']}", flush=True)
            rows.append(peer)
        _write(args, rows)


def _write(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    lines = [
        "# Training speed beside RecBole and RecTools, ML-1M (papers' file), one run",
        "",
        "Matched sizes: BERT4Rec d 64, 2 layers, 2 heads, N 200, batch 128, dropout 0.2, mask "
        "0.2 (ours: `ml-1m-bert4rec`); SASRec d 64, 2 layers, 1 head, N 200, batch 128, "
        "dropout 0.1, full-softmax CE (ours: `ml-1m-sasrec-ce`). 2 threads each. An epoch is a "
        "pass over every training interaction as a target; a peer's epoch time is extrapolated "
        f"from a {args.seconds:.0f}-second window of its own training loop.",
        "",
        "| model | library | version | samples/s | samples per epoch | s/epoch "
        "| seqrec faster by |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['library']} | | failed: {r['error']} | | | |")
            continue
        version = r.get("version", "this commit")
        samples = r.get("samples_per_epoch", r.get("epoch_sequences"))
        speedup = f"{r['our_speedup']:.1f}x" if "our_speedup" in r else "-"
        lines.append(
            f"| {r['model']} | {r['library']} | {version} | {r['seq_per_s']:.0f} "
            f"| {samples:,} | {r['s_per_epoch']:.0f} | {speedup} |"
        )
    payload = {"seconds": args.seconds, "rows": rows}
    write_results(args.name, payload, "\n".join(lines), seeds={"init_and_batches": 0})


if __name__ == "__main__":
    main()
