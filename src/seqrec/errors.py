"""Errors a user can act on. The CLI prints their message as one line and exits non-zero."""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "DownloadError", "RunError", "SeqrecError", "TrainingError"]


class SeqrecError(Exception):
    """Base class: the message is one line that says what was wrong and what was expected."""


class DataError(SeqrecError, ValueError):
    """An input file (or column, or line of it) is not what the reader expected."""


class DownloadError(SeqrecError):
    """A dataset could not be fetched or failed verification."""


class ConfigError(SeqrecError, ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type."""


class RunError(SeqrecError):
    """A run directory's file is missing, damaged, tampered with or in use by another run."""


class TrainingError(SeqrecError):
    """Training diverged (a non-finite loss or weights): the run stops, its last good checkpoint
    is kept."""
