"""Speed on this machine: training, validation, inference, the loss and the scan, data-parallel
training, preparation at scale.

    python benchmarks/speed.py SUBCOMMAND [--help] [ARGS]

Subcommands (each a module of benchmarks/suite; its docstring says what it measures and how):

    throughput             training sequences/s of shipped configs
    time-to-quality        test quality after a series of budgets
    eval-speed             validation speed under full ranking
    inference              a trained run's scoring speed, fp32 and bf16
    quantized              a run's int8 and fp16 ONNX graphs: quality and speed
    ce-chunks              the chunked full-softmax CE at several chunk heights
    lrurec-scan            LRURec's recurrence: recursive doubling against chunks
    distributed            one process against torchrun ranks on one machine
    prepare-scale          preparing an ML-20M-sized log
    prepare-capped         preparing a log larger than the memory allowed
    item-index             the item index's libraries against exact scoring, by catalogue size
"""

from __future__ import annotations

from _common import run_suite

COMMANDS = {
    "throughput": "throughput",
    "time-to-quality": "time_to_quality",
    "eval-speed": "eval_speed",
    "inference": "inference",
    "quantized": "quantized",
    "ce-chunks": "ce_chunks",
    "lrurec-scan": "lrurec_scan",
    "distributed": "distributed",
    "prepare-scale": "prepare_scale",
    "prepare-capped": "prepare_capped",
    "item-index": "item_index",
}

if __name__ == "__main__":
    run_suite(__doc__, COMMANDS)
