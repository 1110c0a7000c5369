"""``accumguard watch`` on GAN-style loops (issue 23, "Errors on correct loops" (a)): the
discriminator's optimizer steps every batch with its own ``zero_grad``, the generator's
accumulates K = 4 batches. Each optimizer is judged on its own window: the correct loop has
no error (it had F3, F7 and F13), the generator's own ``zero_grad`` inside its window is
still F3. Plain PyTorch and Lightning's manual optimisation, recorded as ``watch`` records
them in one ``python`` launch (tests/watch_sweep.py) and judged by the function the CLI
calls; tests/runtime/test_watch.py launches the real CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from watch_sweep import Watched, watch_many

SCRIPT = Path(__file__).resolve().parents[1] / "watch_scripts" / "gan_loops.py"
# (flavour, extra argument) -> -k
CASES = {("plain", ""): 4, ("lightning", ""): None, ("plain", "gen_zero_grad"): None,
         ("lightning", "gen_zero_grad"): 4}


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    pytest.importorskip("pytorch_lightning")
    names = {f"{fl}-{arg or 'ok'}": (fl, arg) for fl, arg in CASES}
    return watch_many(tmp_path_factory.mktemp("gan"), {
        name: [sys.executable, str(SCRIPT), fl, *([arg] if arg else [])]
        for name, (fl, arg) in names.items()},
        ks={name: CASES[case] for name, case in names.items()})


def _watch(watched: dict[str, Watched], flavour: str, arg: str = "",
           k: int | None = None) -> tuple[int, list[dict], dict]:
    assert CASES[(flavour, arg)] == k
    code, findings, report, _ = watched[f"{flavour}-{arg or 'ok'}"]
    return code, findings, report


@pytest.mark.parametrize(("flavour", "k"), [("plain", 4), ("lightning", None)])
def test_gan_correct_loop_has_no_error(watched: dict[str, Watched], flavour: str,
                                       k: int | None) -> None:
    code, findings, _ = _watch(watched, flavour, k=k)
    assert [f for f in findings if f["severity"] == "error"] == [], findings
    assert code == 0
    if k == 4:  # the discriminator steps at its own rate: a note naming it
        (note,) = findings
        assert note["cls"] == "F1" and note["severity"] == "note"
        assert "optimizer #2 (Adam)" in note["evidence"], note


@pytest.mark.parametrize(("flavour", "k"), [("plain", None), ("lightning", 4)])
def test_gan_generator_zero_grad_in_its_window_is_f3(watched: dict[str, Watched], flavour: str,
                                                     k: int | None) -> None:
    code, findings, _ = _watch(watched, flavour, "gen_zero_grad", k=k)
    errors = [f for f in findings if f["severity"] == "error"]
    assert [f["cls"] for f in errors] == ["F3"], findings
    assert errors[0]["evidence"].startswith("optimizer #1 (Adam), judged on its own window")
    assert "zero_grad() ran 3 time(s)" in errors[0]["evidence"]
    assert code == 1
