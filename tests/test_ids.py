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


def test_an_integer_vocabulary_finds_what_the_general_one_does() -> None:
    ids = [1193, 661, 914, 661, 3408, 7]  # 661 twice: the first row wins
    numeric = IdCodec(ids, start=1)
    general = IdCodec([*ids, "z"], start=1)  # one text id: the dict of ids and their texts
    assert numeric._index is None and general._index is not None
    asked = [661, "661", 661.0, "0661", " 661", 661.5, "x", 3408, 7, "7", 8, None, True, 2**70]
    want = [2, 2, 2, None, None, None, None, 5, 6, 6, None, None, None, None]
    assert [numeric.lookup(a) for a in asked] == want
    assert [general.lookup(a) for a in asked] == want
    found, unknown = numeric.encode([914, "3408", 5])
    assert found.tolist() == [3, 5] and unknown == [5]
    assert numeric.encode_rows([7, 1, "1193"]).tolist() == [6, 0, 1]
    assert [numeric.decode(i) for i in (1, 2, 4)] == [1193, 661, 661]
    assert numeric.encode_rows([3408, 661, 2, 7]).tolist() == [5, 2, 0, 6]  # one search
    users = IdCodec([30, 10, 20], start=0)  # rows from 0: row 0 is a known user
    found, unknown = users.encode([30, 99, 20, 2**70])
    assert found.tolist() == [0, 2] and unknown == [99, 2**70]
    assert users.encode([])[0].tolist() == [] and users.encode_rows([10]).tolist() == [1]
