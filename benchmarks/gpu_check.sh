#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a machine with one CUDA GPU, in under 10 minutes.
# From the repository root, the papers' ML-1M file in a data folder laid out like shared/data:
#
#   SEQREC_DATA_DIR=/path/to/data bash benchmarks/gpu_check.sh
#
# On a lent device machine (its image has torch; polars, fastapi & co. travel as wheels, and the
# data folder as a carried copy; both folders ignored by git):
#   mkdir -p .data/bert4rec-paper && cp $SEQREC_DATA_DIR/bert4rec-paper/ml-1m.txt.gz .data/bert4rec-paper/
#   device run: command "bash benchmarks/gpu_check.sh", carry [".whl", ".data"], timeout 600
# The results come back in $OUT (gpu_check.md, gpu_check.json).
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DATA="${SEQREC_DATA_DIR:-$PWD/.data}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 benchmarks/gpu_check.py --data-dir "$DATA" --out "${OUT:-/tmp/gpu-check}" "$@"
