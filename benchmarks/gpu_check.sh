#!/usr/bin/env bash
# The GPU check (benchmarks/gpu.py check) on a machine with one CUDA GPU, in under 10 minutes.
# From the repository root, the papers' ML-1M file in a data folder laid out like shared/data:
#
#   SEQREC_DATA_DIR=/path/to/data bash benchmarks/gpu_check.sh
#
# On a lent device machine (its image has torch; polars travels as wheels, the data folder as a
# carried copy, and a shallow clone's .git so the results record the commit; all three folders
# ignored by git):
#   mkdir -p .data/bert4rec-paper && cp $SEQREC_DATA_DIR/bert4rec-paper/ml-1m.txt.gz .data/bert4rec-paper/
#   cp .whl/polars*.whl .whl-gpu/        # polars and polars_runtime only (the 64 MiB limit)
#   git clone -q --depth 1 "file://$PWD" /tmp/shallow && rm -rf .gpu/git && cp -r /tmp/shallow/.git .gpu/git
#   device run: command "bash benchmarks/gpu_check.sh", carry [".whl-gpu", ".data", ".gpu/git"]
# The results come back in $OUT (gpu_check.md, gpu_check.json, the log).
# The single model for 5 minutes (LRURec, meant to pass full NDCG@10 0.19), alone:
#   bash benchmarks/gpu_check.sh --recipes lrurec-5m --skip-throughput --skip-tests --name gpu_check_lrurec
set -euo pipefail
cd "$(dirname "$0")/.."
for w in .whl-gpu .whl; do
    if compgen -G "$w/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$w"/*.whl
        export PYTHONPATH=/tmp/site
        break
    fi
done
# the device's copy of the tree may hold another checkout's .git: the carried one is this tree's
if [ -d .gpu/git ]; then rm -rf .git && cp -r .gpu/git .git; fi
git rev-parse HEAD 2>/dev/null || echo "no git here: the results record the commit as unknown"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SEQREC_HOME="${SEQREC_HOME:-/tmp/seqrec-home}"
DATA="${SEQREC_DATA_DIR:-$PWD/.data}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
OUT_DIR="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT_DIR"
python3 benchmarks/gpu.py check --data-dir "$DATA" --out "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
