"""Run accounting: every line ends in exactly one place, and the report proves it."""

from __future__ import annotations

from rsieve.report import UNKNOWN_FAMILY, run_report
from rsieve.schemas import Outcome, Quarantined
from rsieve.shards import split_pool
from tests.unit._records import accepted, failed, judged, make_item


def _q(line: int, reason: str, item_id: str | None = None, family: str | None = "SynthWords",
       stage: str = "clean") -> Quarantined:
    return Quarantined(id=item_id, line=line, family=family, stage=stage,  # type: ignore[arg-type]
                       reason=reason)


def _consistent() -> tuple[list[Outcome], list[Quarantined]]:
    outcomes = [
        accepted(make_item("a", line=1)),
        judged(make_item("b", line=2, references=["TEA"]), "COFFEE", "CORRECT"),
        judged(make_item("c", line=3, references=["TEA"]), "COFFEE", "WRONG"),
        judged(make_item("d", line=4, references=["TEA"]), "COFFEE", None),
        failed(make_item("e", line=5), "<think>cut"),
        accepted(make_item("f", line=6, family="DocVQA", protocol="anls", references=["x"])),
    ]
    quarantined = [
        _q(7, "invalid_json", family=None),
        _q(8, "duplicate_id", item_id="a"),
        _q(9, "unknown_protocol", item_id="g", family="NoSuchBench"),
        _q(10, "model_error", item_id="h", stage="generate"),
    ]
    return outcomes, quarantined


def test_consistent_run_adds_up() -> None:
    outcomes, quarantined = _consistent()
    report = run_report(run="r1", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is True
    assert (report["run"], report["lines"], report["placed"]) == ("r1", 10, 10)
    assert report["duplicate_ids"] == []
    assert report["lines_placed_twice"] == []
    assert report["lines_missing"] == []
    fams = report["families"]
    assert list(fams) == sorted(fams)
    assert set(fams) == {"SynthWords", "DocVQA", "NoSuchBench", UNKNOWN_FAMILY}
    synth = fams["SynthWords"]
    assert synth["in"] == 7
    assert (synth["accepted"], synth["accepted_by_verifier"], synth["promoted_by_judge"]) == (
        2, 1, 1)
    assert synth["rejected"] == 3
    assert synth["rejected_by_reason"] == {"judge_unsure": 1, "truncated_reasoning": 1,
                                           "wrong_answer": 1}
    assert synth["quarantined"] == 2
    assert synth["quarantined_by_reason"] == {"duplicate_id": 1, "model_error": 1}
    assert all(f["adds_up"] for f in fams.values())
    assert fams[UNKNOWN_FAMILY]["quarantined_by_reason"] == {"invalid_json": 1}
    assert fams["DocVQA"] == {
        "in": 1, "accepted": 1, "accepted_by_verifier": 1, "promoted_by_judge": 0,
        "rejected": 0, "rejected_by_reason": {}, "quarantined": 0,
        "quarantined_by_reason": {}, "adds_up": True,
    }


def test_empty_run_adds_up() -> None:
    report = run_report(run="r", lines=0, outcomes=[], quarantined=[])
    assert report["adds_up"] is True and report["families"] == {}


def test_line_placed_twice() -> None:
    outcomes, quarantined = _consistent()
    quarantined.append(_q(3, "model_error", item_id="c2", stage="generate"))
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["lines_placed_twice"] == [3]
    assert report["placed"] == 11


def test_same_outcome_twice_is_line_and_id_twice() -> None:
    outcomes, quarantined = _consistent()
    outcomes.append(outcomes[0])
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["lines_placed_twice"] == [1]
    assert report["duplicate_ids"] == ["a"]


def test_line_missing() -> None:
    outcomes, quarantined = _consistent()
    outcomes = [o for o in outcomes if o.generation.item.line != 4]
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["lines_missing"] == [4]
    assert report["placed"] == 9


def test_line_beyond_the_pool_does_not_add_up() -> None:
    outcomes, quarantined = _consistent()
    quarantined.append(_q(11, "invalid_json", family=None))
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False


def test_id_twice() -> None:
    outcomes, quarantined = _consistent()
    # Line 9's item reuses id "b" without being marked a duplicate.
    quarantined[2] = _q(9, "unknown_protocol", item_id="b", family="NoSuchBench")
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["adds_up"] is False
    assert report["duplicate_ids"] == ["b"]
    assert report["lines_placed_twice"] == [] and report["lines_missing"] == []


def test_duplicate_id_quarantine_does_not_count_as_id_twice() -> None:
    outcomes, quarantined = _consistent()
    assert any(q.reason == "duplicate_id" and q.id == "a" for q in quarantined)
    report = run_report(run="r", lines=10, outcomes=outcomes, quarantined=quarantined)
    assert report["duplicate_ids"] == []


def test_lines_missing_is_capped() -> None:
    report = run_report(run="r", lines=500, outcomes=[], quarantined=[])
    assert report["adds_up"] is False
    assert report["lines_missing"] == list(range(1, 101))


def _report_for_pool(data: bytes) -> dict[str, object]:
    """What the cleaner and compactor do: split, quarantine every line, count lines."""
    shards, blank = split_pool(data, 10)
    pool_lines = [p for shard in shards for p in shard]
    quarantined = [_q(p.line, "invalid_json", family=None) for p in pool_lines]
    return run_report(run="r", lines=sum(map(len, shards)), outcomes=[],
                      quarantined=quarantined, blank_lines=blank)


def test_pool_with_trailing_blank_lines_adds_up() -> None:
    assert _report_for_pool(b"x\ny\n\n\n")["adds_up"] is True


def test_pool_with_an_interior_blank_line_adds_up_by_numbers() -> None:
    report = _report_for_pool(b"x\n\ny\n")
    assert report["placed"] == report["lines"] == 2


# The cleaner stores lines = sum(len(shard)) (non-blank lines) while split_pool keeps the
# pool's 1-based numbering across blank lines; run_report then expects lines 1..lines, so the
# blank line's number is reported missing and the run never adds up.
def test_pool_with_an_interior_blank_line_adds_up() -> None:
    report = _report_for_pool(b"x\n\ny\n")
    assert report["lines_missing"] == []
    assert report["adds_up"] is True
