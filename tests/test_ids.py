"""IdCodec: external ids <-> internal ids, text forms matching, unknown ids reported in order."""

from __future__ import annotations

from seqrec.data.ids import IdCodec


def test_encode_decode_and_text_forms() -> None:
    items = IdCodec([1193, 661, "x9", 914], start=1)
    ids, unknown = items.encode([661, "1193", "nope", 914, 7, "x9"])
    assert ids.tolist() == [2, 1, 4, 3] and unknown == ["nope", 7]
    assert [items.decode(i) for i in ids] == [661, 1193, 914, "x9"]
    assert items.lookup("661") == 2 and items.lookup(661.5) is None and len(items) == 4
    users = IdCodec(["a", "b"], start=0)  # users: 0-based rows
    assert users.lookup("b") == 1 and users.decode(0) == "a"


def test_an_exact_id_wins_over_another_ids_text_form() -> None:
    mixed = IdCodec([5, "5"], start=1)  # int 5 and the string "5": each finds itself
    assert mixed.lookup(5) == 1 and mixed.lookup("5") == 2
    assert IdCodec([5, "5"]) == mixed and IdCodec([5]) != mixed
