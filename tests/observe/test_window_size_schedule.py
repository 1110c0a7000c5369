"""Windows whose size changes on purpose (fairseq's ``--update-freq 2 4``: 2 micro-batches a
window in the first epoch, then 4), each normalised by its own size: with K = 4 the first
windows look short, but each weighs what a window of 4 weighs (a large batch of 2): an F13
note saying both readings, not an error (blind round 87 c_b03_fixed). Divided by the first
epoch's 2 throughout (c_b03), the windows of 4 weigh twice as much: a LOSS_SCALE error. The
rules run in this process on the two runs' recordings (2 DDP ranks, recorded by `watch
--keep`, kept in ``recorded/``), with K = 4 as watch read it from the script."""

from __future__ import annotations

from helpers import judge_recorded


def _findings(name: str) -> list:
    return judge_recorded(name, 4)


def test_windows_sized_on_purpose_are_a_note() -> None:
    findings = _findings("r87_update_freq_own_size")
    assert not [f for f in findings if f.severity == "error"], findings
    f13 = [f for f in findings if f.cls == "F13"]
    assert f13 and "normalised to its own size" in f13[0].evidence, findings
    assert "off by one" not in f13[0].title and "a window size the loop chose" in f13[0].title


def test_windows_divided_by_the_first_size_stay_an_error() -> None:
    """Divided by 2 throughout, the windows of K = 4 weigh twice their large batch: a loss
    scale error (the windows are where the script puts them; their weight is wrong)."""
    findings = _findings("r87_update_freq_first_size")
    errors = [f for f in findings if f.severity == "error"]
    assert errors and {f.cls for f in errors} == {"LOSS_SCALE"}, findings
    assert "windows of 4 micro-steps divided as windows of 2" in errors[0].title
    assert "2 x the large batch" in errors[0].title
