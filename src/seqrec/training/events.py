"""TensorBoard event files of a run (`train.tensorboard`), written as the epochs end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

__all__ = ["EventLog"]


class EventLog:
    """A run's epochs as TensorBoard scalars: `train/<key>` for the training numbers of a log
    line (loss, lr, seq_per_s, ...), `valid/<protocol>_<metric>` for the validation metric,
    each at the epoch's number. Flushed every epoch, so TensorBoard shows a run as it trains."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the tensorboard extra

        self._writer = SummaryWriter(log_dir=str(folder))

    def add(self, line: dict[str, Any]) -> None:
        epoch = int(line["epoch"])
        for key, value in line.items():
            if key == "epoch" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            tag = f"valid/{key[6:]}" if key.startswith("valid_") else f"train/{key}"
            self._writer.add_scalar(tag, value, epoch)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
