"""Oracles on the BERT4Rec authors' Beauty file (shared/data/README.md: 40,226 users, 54,542 items,
353,962 actions, Table 1's row). Run when SEQREC_DATA_DIR is set; nothing is copied here."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqrec.data.prepare import prepare
from seqrec.evaluation.protocols import evaluate_split, item_popularity
from seqrec.evaluation.reference import PAPER_ROWS_BEAUTY
from seqrec.models.baselines import Popularity

pytestmark = pytest.mark.e2e


def test_the_papers_beauty_file_is_table_1s_row_and_pop_explains_the_papers_pop_row(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = prepare(shared_data / "bert4rec-paper/beauty.txt.gz", out=tmp_path / "b", progress=False)
    assert (ds.stats["users"], ds.stats["items"], ds.stats["actions"]) == (40226, 54542, 353962)
    # not filtered again, and it says what a 5-core would have done
    assert "a 5-core would keep 198,502 of its 353,962 interactions" in capsys.readouterr().err
    # The paper's POP row is met (within 0.01) by a POP that counts the whole file, held-out
    # items included; seqrec's POP counts the training part and lands lower.
    _, paper = PAPER_ROWS_BEAUTY["pop"]
    whole = Popularity(item_popularity(ds.split.sequences))
    m = evaluate_split(ds, whole, "test", protocols=["pop100"]).metrics["pop100"]
    assert m["hr@10"] == pytest.approx(paper["hr@10"], abs=0.01)
    assert m["ndcg@10"] == pytest.approx(paper["ndcg@10"], abs=0.01)
    ours = evaluate_split(ds, Popularity.fit(ds.split.train), "test", protocols=["pop100"]).metrics
    assert ours["pop100"]["hr@10"] < paper["hr@10"] - 0.01
