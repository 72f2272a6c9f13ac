from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.config import DataConfig, EvalConfig
from seqrec.data.prepare import prepare
from seqrec.data.prepared import load_prepared
from seqrec.data.synthetic import synthetic_interactions
from seqrec.errors import ConfigError, DataError


def _write_log(path: Path, seed: int = 0) -> Path:
    df = synthetic_interactions(n_users=60, n_items=40, seed=seed)
    lines = [f"{u}::{i}::5::{t}" for u, i, t in df.select("user", "item", "timestamp").iter_rows()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prepare_writes_and_reloads(tmp_path: Path) -> None:
    src = _write_log(tmp_path / "ratings.dat")
    out = tmp_path / "prep"
    ds = prepare(src, out=out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "negatives.npz",
        "sequences.parquet",
        "stats.json",
        "vocab.json",
    ]
    again = load_prepared(out)
    assert np.array_equal(again.sequences.items, ds.sequences.items)
    assert np.array_equal(again.sequences.offsets, ds.sequences.offsets)
    assert again.item_ids == ds.item_ids and again.user_ids == ds.user_ids
    for split in ("valid", "test"):
        negs = again.negatives(split)
        assert set(negs) == {"uni100", "pop100"}
        assert negs["uni100"].shape == (len(again.split.test.users), 100)


def test_prepare_reuses_unchanged_and_rebuilds_changed(tmp_path: Path) -> None:
    src = _write_log(tmp_path / "ratings.dat")
    out = tmp_path / "prep"
    prepare(src, out=out, progress=False)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    prepare(src, out=out, progress=False)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp  # reused, not rewritten
    # another setting: the folder is seqrec's, but replaced only when told (seqrec.outputs)
    with pytest.raises(ConfigError, match="another source or settings; --force replaces it"):
        prepare(src, out=out, data_cfg=DataConfig(min_item_interactions=1), progress=False)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    ds = prepare(
        src, out=out, data_cfg=DataConfig(min_item_interactions=1), force=True, progress=False
    )
    assert (out / "manifest.json").stat().st_mtime_ns != stamp  # a setting changed
    assert ds.manifest["key"]["data"]["min_item_interactions"] == 1
    ds2 = prepare(
        src,
        out=out,
        data_cfg=DataConfig(min_item_interactions=1),
        eval_cfg=EvalConfig(negative_seed=1),
        force=True,
        progress=False,
    )
    assert not np.array_equal(ds2.negatives("test")["uni100"], ds.negatives("test")["uni100"])


def test_negatives_are_reproducible_from_seed(tmp_path: Path) -> None:
    src = _write_log(tmp_path / "ratings.dat")
    a = prepare(src, out=tmp_path / "a", progress=False)
    b = prepare(src, out=tmp_path / "b", progress=False)
    for split in ("valid", "test"):
        for p in ("uni100", "pop100"):
            assert np.array_equal(a.negatives(split)[p], b.negatives(split)[p])


def test_bad_input_leaves_no_partial_directory(tmp_path: Path) -> None:
    src = tmp_path / "ratings.dat"
    src.write_text("1::2::5::3\n1::x::5::4\n")
    with pytest.raises(DataError, match=r"ratings\.dat:2: MovieID 'x'"):
        prepare(src, out=tmp_path / "prep" / "ds", progress=False)
    assert not (tmp_path / "prep" / "ds").exists()
    leftovers = list((tmp_path / "prep").iterdir()) if (tmp_path / "prep").exists() else []
    assert leftovers == []


def test_failure_while_writing_keeps_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _write_log(tmp_path / "ratings.dat")
    out = tmp_path / "prep"
    prepare(src, out=out, progress=False)
    before = sorted(os.listdir(out))

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        prepare(src, out=out, force=True, progress=False)
    assert sorted(os.listdir(out)) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    load_prepared(out)  # still whole


def test_unknown_name_or_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file, and not a dataset name"):
        prepare(str(tmp_path / "missing.csv"), progress=False)


def test_stored_negatives_never_hold_what_the_split_knows(tmp_path: Path) -> None:
    """Leakage guards on what is stored: test negatives never hold a history, validation or test
    item; validation negatives never hold an item up to and including the validation target,
    and may hold the test item (unknown at that time: blocking it would leak the future)."""
    ds = prepare(_write_log(tmp_path / "ratings.dat"), out=tmp_path / "prep", progress=False)
    users = ds.split.test.users
    drawn_test_item = 0
    for negs in ds.negatives("test").values():
        for e, u in enumerate(users):
            assert not set(negs[e].tolist()) & set(ds.sequences[u].tolist())
    for negs in ds.negatives("valid").values():
        for e, u in enumerate(users):
            known = ds.sequences[u].tolist()[:-1]  # history + validation target
            assert not set(negs[e].tolist()) & set(known)
            drawn_test_item += int(ds.split.test.targets[e] in negs[e])
    assert drawn_test_item > 0  # 40 items, 100 negatives: the test item is often eligible


# sha256 of the candidates (and sequences, and their times) prepared from `_write_log(seed=0)`,
# per format version. Changing the preprocessing or the candidate sampling changes it: bump
# FORMAT_VERSION (so old caches rebuild) and add the new digest here.
PREPARED_DIGESTS = {3: "eeda02b654bebc7df2189bef338ba5a16cbac214b28fb873884ceab71894189c"}


def test_changing_the_sampler_needs_a_format_version_bump(tmp_path: Path) -> None:
    import hashlib

    from seqrec.data.prepared import FORMAT_VERSION

    ds = prepare(_write_log(tmp_path / "ratings.dat"), out=tmp_path / "prep", progress=False)
    h = hashlib.sha256(ds.sequences.items.astype(np.int64).tobytes())
    assert ds.sequences.times is not None  # a ratings.dat log: its timestamps are kept
    h.update(ds.sequences.times.astype(np.int64).tobytes())
    for split in ("valid", "test"):
        for p, negs in sorted(ds.negatives(split).items()):
            h.update(f"{split}_{p}".encode() + negs.astype(np.int64).tobytes())
    assert PREPARED_DIGESTS.get(FORMAT_VERSION) == h.hexdigest(), (
        "the prepared data changed: bump FORMAT_VERSION in seqrec/data/prepared.py and record "
        f"{h.hexdigest()} for it in PREPARED_DIGESTS"
    )


def test_a_published_user_item_file_is_not_filtered_again_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Users 1-6 have 6 items each among items 1-6; user 7 has 3 items and item 7 appears once:
    # a 5-core drops user 7 (3 < 5) and item 7 (1 < 5), i.e. 3 of the 39 interactions.
    lines = [f"{u} {i}" for u in range(1, 7) for i in range(1, 7)] + ["7 1", "7 2", "7 7"]
    src = tmp_path / "paper.txt"
    src.write_text("\n".join(lines) + "\n")
    ds = prepare(src, out=tmp_path / "as-is", progress=False)
    assert (ds.stats["users"], ds.stats["items"], ds.stats["actions"]) == (7, 7, 39)
    note = capsys.readouterr().err
    assert "paper.txt: a published `user item` dataset, taken as it is" in note
    assert "would keep 36 of its 39 interactions" in note
    cfg = DataConfig(min_user_interactions=5, min_item_interactions=5)
    ds5 = prepare(src, out=tmp_path / "5-core", data_cfg=cfg, progress=False)
    assert (ds5.stats["users"], ds5.stats["items"], ds5.stats["actions"]) == (6, 6, 36)
    note = capsys.readouterr().err  # a recipe's k-core on a published file says what it removed
    assert "paper: the 5-user/5-item core removed 1 users, 1 items and 3 of 39 interactions" in note
    assert ds5.stats["kcore"]["removed"] == {"users": 1, "items": 1, "interactions": 3}
    cfg3 = DataConfig(min_user_interactions=3, min_item_interactions=1)  # removes nothing
    prepare(src, out=tmp_path / "3-core", data_cfg=cfg3, progress=False)
    assert capsys.readouterr().err == ""


def test_a_raw_log_is_kept_whole_by_default_and_a_papers_dataset_by_name_gets_its_5_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [f"{u}::{i}::5::{10 * u + i}" for u in range(1, 7) for i in range(1, 7)]
    lines += ["7::1::5::1", "7::2::5::2", "7::7::5::3"]
    src = tmp_path / "ratings.dat"
    src.write_text("\n".join(lines) + "\n")
    ds = prepare(src, out=tmp_path / "p", progress=False)
    assert (ds.stats["users"], ds.stats["items"], ds.stats["actions"]) == (7, 7, 39)
    # the same file as the dataset `ml-1m` (in the cache, where a download puts it): the
    # papers' 5-core
    cached = tmp_path / "home" / "datasets" / "ml-1m" / "ml-1m" / "ratings.dat"
    cached.parent.mkdir(parents=True)
    cached.write_text(src.read_text())
    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    ds = prepare("ml-1m", out=tmp_path / "named", progress=False)
    assert (ds.stats["users"], ds.stats["items"], ds.stats["actions"]) == (6, 6, 36)


def test_sequences_prepared_by_another_engine_are_checked_and_completed(tmp_path: Path) -> None:
    # a directory holding only the documented schema (what a Spark job would write) prepares
    # to what seqrec's own preparation of the same log holds: the same sequences, ids and
    # candidates
    ours = prepare(_write_log(tmp_path / "ratings.dat"), out=tmp_path / "ours", progress=False)
    theirs = tmp_path / "spark"
    theirs.mkdir()
    table = pl.read_parquet(ours.path / "sequences.parquet")
    table.write_parquet(theirs / "sequences.parquet")
    (theirs / "vocab.json").write_text((ours.path / "vocab.json").read_text())
    ds = prepare(theirs, out=tmp_path / "prepared", progress=False)
    assert np.array_equal(ds.sequences.items, ours.sequences.items)
    assert np.array_equal(ds.sequences.offsets, ours.sequences.offsets)
    assert ds.item_ids == ours.item_ids and ds.user_ids == ours.user_ids
    for split in ("valid", "test"):
        for p, negs in ds.negatives(split).items():
            assert np.array_equal(negs, ours.negatives(split)[p])
    assert sorted(x.name for x in theirs.iterdir()) == ["sequences.parquet", "vocab.json"]

    def refused(frame: pl.DataFrame, message: str) -> None:
        frame.write_parquet(theirs / "sequences.parquet")
        with pytest.raises(DataError, match=message):
            prepare(theirs, out=tmp_path / "refused", progress=False)
        assert not (tmp_path / "refused").exists()

    n_users, n_items = ours.n_users, ours.n_items
    refused(
        table.with_columns(pl.col("item").cast(pl.String)),
        r"column item must be integers, found String",
    )
    refused(table.drop("user"), r"column user must be integers, found no such column")
    refused(
        table.with_columns(
            pl.when(pl.int_range(pl.len()) == 3)
            .then(n_items + 1)
            .otherwise(pl.col("item"))
            .alias("item")
        ),
        rf"row 3: item {n_items + 1} is not in 1\.\.{n_items}",
    )
    refused(table.reverse(), r"rows must be grouped by user in ascending order")
    refused(table.filter(pl.col("user") != 1), r"user 1 of vocab\.json has no rows")
    refused(
        table.with_columns(pl.col("user") + n_users),
        rf"user {n_users} is not a position in vocab\.json's {n_users} users",
    )
    (theirs / "vocab.json").write_text('{"users": []}')
    with pytest.raises(DataError, match=r'vocab\.json: expected \{"users": \[ids\.\.\.\], "items"'):
        prepare(theirs, out=tmp_path / "refused", progress=False)


def test_out_may_be_a_string(tmp_path: Path) -> None:
    lines = [f"{u} {i}" for u in range(1, 7) for i in range(1, 7)]
    src = tmp_path / "paper.txt"
    src.write_text("\n".join(lines) + "\n")
    ds = prepare(str(src), out=str(tmp_path / "p"), progress=False)
    assert (ds.stats["users"], ds.stats["actions"]) == (6, 36)
    assert (tmp_path / "p").is_dir()
    again = prepare(str(src), out=str(tmp_path / "p"), progress=False)  # reused as it is
    assert again.stats == ds.stats


def test_candidates_are_read_when_first_needed_from_the_file_that_was_loaded(
    tmp_path: Path,
) -> None:
    """Recommending and serving never read the stored candidates (1.6 GB at a million users):
    they are read on first use, from the file the dataset was loaded with, even when the
    folder has been prepared again since."""
    src = _write_log(tmp_path / "ratings.dat")
    prepare(src, out=tmp_path / "a", progress=False)
    other = prepare(
        src, out=tmp_path / "b", eval_cfg=EvalConfig(negative_seed=7), progress=False
    ).negatives("test")
    first = load_prepared(tmp_path / "a")
    stored = load_prepared(tmp_path / "a").negatives("test")
    assert not np.array_equal(stored["uni100"], other["uni100"])
    os.replace(tmp_path / "b" / "negatives.npz", tmp_path / "a" / "negatives.npz")
    assert np.array_equal(first.negatives("test")["uni100"], stored["uni100"])  # its own file
    again = load_prepared(tmp_path / "a").negatives("test")  # a new load reads the new file
    assert np.array_equal(again["uni100"], other["uni100"])
    (tmp_path / "a" / "negatives.npz").write_bytes(b"not a zip archive")
    broken = load_prepared(tmp_path / "a")
    with pytest.raises(DataError) as err:
        broken.negatives("valid")
    assert "not readable as stored candidates" in str(err.value) and "\n" not in str(err.value)
