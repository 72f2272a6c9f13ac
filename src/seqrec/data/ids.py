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
    """`ids[k]` is internal id `start + k`; lookups also match an id's text form.

    A vocabulary of integers (the usual log of numeric ids) is looked up in a sorted array
    rather than a dict holding each id and its text (which at ten million items holds
    gigabytes and takes seconds to build). Both find the same ids: an integer, an integral
    float, or the text an integer prints as ("1193"; not "01193")."""

    def __init__(self, ids: Sequence[Any], start: int = 1) -> None:
        self.ids = list(ids)
        self.start = start
        self._index: dict[Any, int] | None = None
        self._values: np.ndarray | None = None  # sorted integer ids, and where each was
        self._rows: np.ndarray | None = None
        if self.ids and all(type(x) is int for x in self.ids):
            values = np.asarray(self.ids, dtype=np.int64)
            self._rows = np.argsort(values, kind="stable")  # a repeated id: its first row
            self._values = values[self._rows]
            return
        self._index = {}
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
        if self._index is None:
            return self._lookup_number(external)
        found = self._index.get(external)
        if found is None and not isinstance(external, str):
            found = self._index.get(str(external))
        return found

    def _lookup_number(self, external: Any) -> int | None:
        """`lookup` in an integer vocabulary: what the dict of ids and their texts would find."""
        if isinstance(external, str):
            try:
                key = int(external)
            except ValueError:
                return None
            if str(key) != external:  # " 7", "07", "7_0" are not the text of 7
                return None
        elif isinstance(external, int | np.integer) or (
            isinstance(external, float | np.floating) and float(external).is_integer()
        ):
            key = int(external)  # an integral float finds its integer, as in a dict
        else:
            return None
        searched = self._search([key])
        if searched is None or not searched[1][0]:  # None: beyond int64, so no id
            return None
        return int(searched[0][0])

    def encode(self, externals: Iterable[Any]) -> tuple[np.ndarray, list[Any]]:
        """External ids -> (internal ids of the known ones, in order; the unknown ones)."""
        externals = list(externals)
        searched = self._search(externals)
        if searched is not None:
            rows, known = searched
            return rows[known], [e for e, k in zip(externals, known, strict=True) if not k]
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
        externals = list(externals)
        searched = self._search(externals)
        if searched is not None:
            rows, known = searched
            return np.where(known, rows, 0)
        return np.asarray([self.lookup(e) or 0 for e in externals], dtype=np.int64)

    def _search(self, externals: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
        """Integers in an integer vocabulary, all at once: (internal ids, whether each is
        known); None for anything else (looked up one at a time)."""
        if self._values is None or not all(type(e) is int for e in externals):
            return None
        assert self._rows is not None
        try:
            keys = np.asarray(externals, dtype=np.int64).reshape(-1)
        except OverflowError:  # beyond int64: no such id, but say so one at a time
            return None
        at = np.searchsorted(self._values, keys).clip(max=len(self._values) - 1)
        known = self._values[at] == keys
        return (self._rows[at] + self.start).astype(np.int64), known

    def decode(self, internal: int) -> Any:
        """The external id of an internal one."""
        return self.ids[int(internal) - self.start]
