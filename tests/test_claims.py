"""Every measured number in README.md and docs/**/*.md is a claim checked against the results file
it comes from, or a table copied from one (benchmarks/claims.py); a mismatch, a missing source
or an unsourced measured-looking number fails."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from seqrec.evaluation.reference import published_numbers


def test_the_checker_catches_a_wrong_number_a_missing_source_and_an_unsourced_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, benchmark_script: Callable[[str], ModuleType]
) -> None:
    claims = benchmark_script("claims")
    results = tmp_path / "results"
    results.mkdir()
    (results / "r.json").write_text('{"runs": [{"ndcg": 0.18104}], "share": 0.6412}')
    (results / "r.md").write_text("# r\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    monkeypatch.setattr(claims, "RESULTS", results)
    doc = tmp_path / "doc.md"
    good = (
        "NDCG 0.1810<!-- = r.json runs.0.ndcg --> at 64 %<!-- = r.json share x100 -->.\n"
        "<!-- table: r.md 1 -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- /table -->\n"
        "The paper's 0.4818 is published.\n"
    )
    doc.write_text(good)
    assert claims.check_docs([doc], published_numbers()) == []
    doc.write_text(good.replace("0.1810<", "0.1811<"))
    assert "0.1811 but r.json runs.0.ndcg is 0.181040" in str(claims.check_docs([doc], set())[0])
    doc.write_text(good.replace("runs.0.ndcg", "runs.1.ndcg"))
    assert "no such value" in str(claims.check_docs([doc], published_numbers())[0])
    doc.write_text(good + "It ran at 455 seq/s and reached 0.1234.\n")
    found = [p.message for p in claims.check_docs([doc], published_numbers())]
    assert found == [
        "455 looks measured but names no results file",
        "0.1234 looks measured but names no results file",
    ]
    # a claim whose key holds a space is not checked at all, so it is an error, not a pass
    doc.write_text(good + "At 10.3<!-- = r.json a b --> %.\n")
    found = [p.message for p in claims.check_docs([doc], published_numbers())]
    assert len(found) == 1 and found[0].startswith("a claim that does not parse")
    doc.write_text(good.replace("| 1 | 2 |\n<!--", "| 1 | 3 |\n<!--"))
    assert "table differs" in str(claims.check_docs([doc], published_numbers())[0])
    assert claims.render_tables(doc) and claims.check_docs([doc], published_numbers()) == []


def test_every_measured_number_in_the_docs_traces_to_a_results_file(
    benchmark_script: Callable[[str], ModuleType],
) -> None:
    claims = benchmark_script("claims")
    problems = claims.check_docs(claims.docs(), published_numbers())
    assert not problems, "\n".join(map(str, problems))


def test_a_key_path_reaches_keys_that_hold_dots(
    benchmark_script: Callable[[str], ModuleType],
) -> None:
    """Experiment results key their extra columns by metric name ("valid.full.ndcg@10"): the path
    takes the longest key present at each level, and a key that is not there is a KeyError."""
    claims = benchmark_script("claims")
    data = {
        "summary": [{"columns": {"valid.full.ndcg@10": {"mean": 0.25}, "valid": {"x": 1.0}}}],
    }
    assert claims._lookup(data, "summary.0.columns.valid.full.ndcg@10.mean") == 0.25
    assert claims._lookup(data, "summary.0.columns.valid.x") == 1.0
    with pytest.raises(KeyError):
        claims._lookup(data, "summary.0.columns.valid.full.hr@10.mean")
