"""External ids <-> seqrec's internal ids: the one mapping a prepared dataset's vocabulary defines
(items 1..n, 0 being padding; users 0..n-1) and that the recommender, `serve` and `recommend_user`
read back. Ids as typed by a person or sent as JSON may be text where the data had integers, so
an id also matches by its text form ("1193" finds 1193)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from seqrec.errors import ConfigError

__all__ = ["IdCodec", "check_items", "same_items"]


def same_items(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two item vocabularies are the same items in the same order: a run's scores then
    mean the same items as a dataset's ids (or another run's)."""
    return list(a) == list(b)


def check_items(
    trained: Sequence[Any],
    given: Sequence[Any],
    where: Any,
    given_by: Any = "the data gives",
    error: type[Exception] = ConfigError,
) -> None:
    """A run trained on `trained` items used with data of `given` items: the same items in the
    same order, or one line (`error`, a ConfigError unless said) naming `where` (the run, or
    what refers to it) and `given_by` (where the other items come from)."""
    if not same_items(trained, given):
        raise error(
            f"{where}: the run was trained on other items than {given_by} "
            f"({len(trained)} vs {len(given)})"
        )


class IdCodec:
    """`ids[k]` is internal id `start + k`; lookups also match an id's text form."""

    def __init__(self, ids: Sequence[Any], start: int = 1) -> None:
        self.ids = list(ids)
        self.start = start
        self._index: dict[Any, int] = {}
        for k, external in enumerate(self.ids, start=start):
            self._index.setdefault(external, k)
        for k, external in enumerate(self.ids, start=start):
            self._index.setdefault(str(external), k)  # an exact match wins over a text one

    def __len__(self) -> int:
        return len(self.ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdCodec) and (self.ids, self.start) == (other.ids, other.start)

    def __hash__(self) -> int:
        return hash((len(self.ids), self.start))

    def lookup(self, external: Any) -> int | None:
        """The internal id of one external id, or None when it is not in the vocabulary."""
        found = self._index.get(external)
        if found is None and not isinstance(external, str):
            found = self._index.get(str(external))
        return found

    def encode(self, externals: Iterable[Any]) -> tuple[np.ndarray, list[Any]]:
        """External ids -> (internal ids of the known ones, in order; the unknown ones)."""
        ids, unknown = [], []
        for external in externals:
            found = self.lookup(external)
            if found is None:
                unknown.append(external)
            else:
                ids.append(found)
        return np.asarray(ids, dtype=np.int64), unknown

    def encode_rows(self, externals: Iterable[Any]) -> np.ndarray:
        """External ids -> their internal ids, 0 for one not in the vocabulary."""
        return np.asarray([self.lookup(e) or 0 for e in externals], dtype=np.int64)

    def decode(self, internal: int) -> Any:
        """The external id of an internal one."""
        return self.ids[int(internal) - self.start]
