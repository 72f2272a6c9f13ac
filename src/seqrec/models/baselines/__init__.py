"""Non-neural and classic baselines, one file each."""

from seqrec.models.baselines.pop import Popularity

__all__ = ["Popularity"]
