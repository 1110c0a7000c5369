"""accumguard invariance without the observation layer: inputs, comparison, report, processes.

Recordings are written here by hand in the observation layer's format
(``rank-<R>.jsonl`` step records, ``updates-rank-<R>.pt`` update lists), so the
comparison is tested on exactly known numbers; the real scripts are in
test_invariance_scripts.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from accumguard import invariance as inv
from accumguard.core.errors import ConfigError
from accumguard.invariance import (
    CommandFailedError,
    InvarianceOptions,
    build_report,
    check_command,
    compare_runs,
    expand_command,
    invariance_tolerance,
    load_run,
    micro_batch,
    parse_ks,
)
from accumguard.invariance import _run as inv_run
from accumguard.observe import invariance_hooks

SCRIPTS = Path(__file__).resolve().parents[1] / "invariance_scripts"


# ----------------------------------------------------------------------------- synthetic records
def _updates(step: int, scale: float = 1.0, world: int = 2) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(step)
    w = torch.randn(4, 3, generator=g, dtype=torch.float64)
    b = torch.randn(3, generator=g, dtype=torch.float64)
    return [{"w": w * scale, "b": b * scale} for _ in range(world)]


def write_run(d: Path, *, steps: int = 3, world: int = 2, k: int = 1,
              loss: Any = None, update_scale: Any = None, applied: Any = None,
              dtype: str | None = None, updates: bool = True) -> Path:
    """One run in the observation layer's format; ``loss``/``update_scale``/``applied`` are
    functions of (step, rank) so a test can perturb one step."""
    d.mkdir(parents=True, exist_ok=True)
    loss = loss or (lambda s, r: 2.0 - 0.1 * s)
    update_scale = update_scale or (lambda s, r: 1.0)
    applied = applied or (lambda s, r: True)
    for r in range(world):
        lines = []
        ups = []
        for s in range(steps):
            rec = {"kind": "step", "rank": r, "step": s, "backwards": k,
                   "window_loss": loss(s, r), "applied": applied(s, r)}
            if dtype:
                rec["param_dtype"] = dtype
            lines.append(json.dumps(rec))
            if applied(s, r):
                ups.append(_updates(s, update_scale(s, r), world)[r])
        # Other record kinds are ignored.
        lines.insert(0, json.dumps({"kind": "backward", "rank": r, "step": 0}))
        (d / f"rank-{r}.jsonl").write_text("\n".join(lines) + "\n")
        if updates:
            torch.save(ups, d / f"updates-rank-{r}.pt")
    return d


# ----------------------------------------------------------------------------- inputs
def test_parse_ks_and_micro_batch() -> None:
    assert parse_ks("1,4") == (1, 4)
    assert parse_ks(" 1, 2 ,8 ") == (1, 2, 8)
    with pytest.raises(ConfigError, match="comma-separated"):
        parse_ks("1;4")
    assert micro_batch(8, 4) == 2
    with pytest.raises(ConfigError, match=r"--batch 6 is not divisible by K=4.*1, 2, 3, 6"):
        micro_batch(6, 4)
    with pytest.raises(ConfigError, match="not divisible by K=3"):
        InvarianceOptions(command=("python", "x.py"), ks=(1, 3), batch=8)
    with pytest.raises(ConfigError, match="at least two"):
        InvarianceOptions(command=("python", "x.py"), ks=(4,))
    with pytest.raises(ConfigError, match="repeats"):
        InvarianceOptions(command=("python", "x.py"), ks=(1, 1))
    with pytest.raises(ConfigError, match="no command"):
        InvarianceOptions(command=(), ks=(1, 4))
    with pytest.raises(ConfigError, match="--steps"):
        InvarianceOptions(command=("python",), steps=0)


def test_expand_command() -> None:
    cmd = ["torchrun", "train.py", "--gradient_accumulation_steps", "{K}", "--bs={MB}"]
    assert expand_command(cmd, 4, 2) == ["torchrun", "train.py", "--gradient_accumulation_steps",
                                         "4", "--bs=2"]
    with pytest.raises(ConfigError, match="--batch"):
        expand_command(cmd, 4, None)


def test_check_command(tmp_path: Path) -> None:
    py = sys.executable
    with pytest.raises(ConfigError, match="command not found: 'no-such-trainer-xyz'"):
        check_command(["no-such-trainer-xyz", "{K}"], batch=None)
    plain = tmp_path / "plain.py"
    plain.write_text("print('hello')\n")
    with pytest.raises(ConfigError, match="every K would run the same training"):
        check_command([py, str(plain)], batch=None)
    # The script reads the environment: fine, nothing to say.
    assert check_command([py, str(SCRIPTS / "token_lm.py")], batch=8) == []
    # Nobody can tell (a module): a warning, not an error.
    notes = check_command([py, "-m", "some.module"], batch=None)
    assert len(notes) == 1 and "assuming it reads ACCUMGUARD_K" in notes[0]
    notes = check_command([py, str(plain), "--accum", "{K}"], batch=None)
    assert "keep the effective batch fixed" in notes[0]
    with pytest.raises(ConfigError, match="no --batch"):
        check_command([py, str(plain), "--bs", "{MB}"], batch=None)


def test_tolerance_from_dtype() -> None:
    assert invariance_tolerance("float32", 4)[0] == inv.FP32_TOLERANCE
    # a correct loop at bf16/fp16 compute: 1e-4 + twice the compute floor (u), as the audit
    tol, reason = invariance_tolerance("torch.bfloat16", 4)
    assert tol == pytest.approx(1e-4 + 2 * 2 ** -8) and "bf16" in reason
    assert invariance_tolerance("float16", 8)[0] == pytest.approx(1e-4 + 2 * 2 ** -11)
    assert "assumed float32" in invariance_tolerance(None, 4)[1]


# ----------------------------------------------------------------------------- comparison
def test_identical_runs_agree(tmp_path: Path) -> None:
    ref = load_run(write_run(tmp_path / "k1", k=1), k=1)
    run = load_run(write_run(tmp_path / "k4", k=4), k=4)
    assert ref.world_size == 2 and len(ref.steps) == 3
    assert ref.steps[0].window_loss == pytest.approx(4.0)  # summed over the two ranks
    comp = compare_runs(ref, run, 1e-4)
    assert not comp.diverged and comp.max_update_rel_diff == 0.0
    assert [s.step for s in comp.steps] == [1, 2, 3]  # 1-based for the user
    assert all(s.decided_by == "update" for s in comp.steps)


def test_update_divergence_found_at_its_step(tmp_path: Path) -> None:
    ref = load_run(write_run(tmp_path / "k1"), k=1)
    # Rank 1's update at the second step (index 1) is 1 % too large.
    run = load_run(write_run(tmp_path / "k4", k=4,
                             update_scale=lambda s, r: 1.01 if (s, r) == (1, 1) else 1.0), k=4)
    comp = compare_runs(ref, run, 1e-4)
    assert comp.first_divergent_step == 2
    s2 = comp.steps[1]
    # One of two equal-size ranks off by 1 %: 0.01 * ||u|| / (sqrt(2) ||u||).
    assert s2.update_rel_diff == pytest.approx(0.01 / math.sqrt(2), rel=1e-9)
    assert not comp.steps[0].diverged and not comp.steps[2].diverged
    # Just under the difference: no divergence.
    assert not compare_runs(ref, run, 0.0071).diverged


def test_loss_scale_alone_is_a_note_not_a_divergence(tmp_path: Path) -> None:
    ref = load_run(write_run(tmp_path / "k1"), k=1)
    run = load_run(write_run(tmp_path / "k4", k=4, loss=lambda s, r: 4 * (2.0 - 0.1 * s)), k=4)
    comp = compare_runs(ref, run, 1e-4)
    assert not comp.diverged
    assert comp.max_loss_rel_diff == pytest.approx(3.0)
    assert any("updates agree" in n for n in comp.notes)


def test_loss_decides_without_updates(tmp_path: Path) -> None:
    ref = load_run(write_run(tmp_path / "k1", updates=False), k=1)
    run = load_run(write_run(tmp_path / "k4", k=4, updates=False,
                             loss=lambda s, r: 2.0 - 0.1 * s + (0.01 if s == 2 else 0.0)), k=4)
    comp = compare_runs(ref, run, 1e-4)
    assert comp.first_divergent_step == 3 and comp.steps[2].decided_by == "loss"
    assert any("window loss only" in n for n in comp.notes)


def test_skipped_step_aligns_updates(tmp_path: Path) -> None:
    # The K=4 run skips (no-op) its second step on rank 0: its updates list is one shorter,
    # and the third update must still be compared with the reference's third.
    ref = load_run(write_run(tmp_path / "k1"), k=1)
    run = load_run(write_run(tmp_path / "k4", k=4,
                             applied=lambda s, r: (s, r) != (1, 0)), k=4)
    assert sorted(run.updates[0]) == [0, 2]
    comp = compare_runs(ref, run, 1e-4)
    assert comp.first_divergent_step == 2
    assert comp.steps[1].update_rel_diff == pytest.approx(1 / math.sqrt(2))
    assert comp.steps[2].update_rel_diff == 0.0


def test_backward_counts_and_step_counts_noted(tmp_path: Path) -> None:
    ref = load_run(write_run(tmp_path / "k1", steps=3), k=1)
    run = load_run(write_run(tmp_path / "k4", steps=2, k=1), k=4)  # 1 backward per step at K=4
    comp = compare_runs(ref, run, 1e-4)
    assert len(comp.steps) == 2
    assert any("comparing the first 2" in n for n in comp.notes)
    assert any("K=4: 1 backward pass(es) per rank per optimizer step at 2 of 2 steps (step "
               "1: [1, 1])" in n for n in comp.notes), comp.notes


def test_backward_count_note_agrees_with_an_ok_verdict(tmp_path: Path) -> None:
    """Issue 23: "OK: every K agrees" then "3 of 3 steps differ" (it meant the backward
    counts). The note says what differs (backward passes per step), and beside an OK verdict
    that the updates agree anyway; beside a divergence it suggests why."""
    from accumguard.cli.invariance import format_text

    ref = load_run(write_run(tmp_path / "k1"), k=1)
    summed = load_run(write_run(tmp_path / "k4", k=1), k=4)  # one backward per step at K=4
    report = build_report([ref, summed], command=["x"], batch=8, steps=3)
    text = format_text(report)
    assert "OK: every K agrees" in text
    assert "steps differ" not in text, text
    (note,) = [n for n in report.comparisons[0].notes if "backward" in n]
    assert note.startswith("K=4: 1 backward pass(es) per rank per optimizer step at 3 of 3 "
                           "steps (step 1: [1, 1]), where one per micro-batch makes 4"), note
    assert "the updates agree with K=1" in note and "may not take K" in note
    bad = load_run(write_run(tmp_path / "k4b", k=1, update_scale=lambda s, r: 2.0), k=4)
    report = build_report([ref, bad], command=["x"], batch=8, steps=3)
    (note,) = [n for n in report.comparisons[0].notes if "backward" in n]
    assert report.diverged and "the updates agree" not in note
    assert "steps on micro-steps" in note


def test_torn_last_line_and_uneven_ranks(tmp_path: Path) -> None:
    d = write_run(tmp_path / "k1", steps=3)
    with (d / "rank-1.jsonl").open("a") as f:
        f.write('{"kind": "step", "rank": 1, "st')  # killed mid-write
    lines = (d / "rank-0.jsonl").read_text().splitlines()
    (d / "rank-0.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    run = load_run(d, k=1)
    assert len(run.steps) == 2
    assert any("different numbers of optimizer steps" in n for n in run.notes)


def test_report_json_text_plot(tmp_path: Path) -> None:
    from accumguard.cli.invariance import format_text, print_report, write_plot

    runs = [load_run(write_run(tmp_path / "k1", dtype="float32"), k=1, micro_batch=8),
            load_run(write_run(tmp_path / "k4", k=4, dtype="float32",
                               update_scale=lambda s, r: 1.0 + 0.05 * s), k=4, micro_batch=2)]
    report = build_report(runs, command=["python", "t.py"], batch=8, steps=3)
    assert report.tolerance == inv.FP32_TOLERANCE and "float32" in report.tolerance_reason
    assert report.first_divergent_step == 2 and report.exit_code == 1
    text = format_text(report)
    assert "DIVERGED: K=4 differs from K=1 from step 2 on" in text
    assert "bwd/rank K=1|K" in text
    data = json.loads(report.write_json(tmp_path / "out" / "r.json").read_text())
    assert data["first_divergent_step"] == 2 and data["diverged"] is True
    assert data["comparisons"][0]["steps"][1]["update_rel_diff"] == pytest.approx(0.05)
    assert data["runs"][1]["micro_batch"] == 2
    png = write_plot(report, tmp_path / "out" / "r.png")
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
    import io

    buf = io.StringIO()
    print_report(report, file=buf)
    assert "DIVERGED" in buf.getvalue() and "update rel diff" in buf.getvalue()
    ok = build_report(runs[:1] + [load_run(tmp_path / "k1", k=2)], command=["x"], batch=8,
                      steps=3)
    assert ok.exit_code == 0 and "OK: every K agrees" in format_text(ok)


# ----------------------------------------------------------------------------- hooks
def test_disable_dropout_and_restore() -> None:
    import torch.nn.functional as F

    x = torch.ones(64, 8)
    drop = torch.nn.Dropout(0.5).train()
    assert not torch.equal(drop(x), x)
    q = torch.randn(1, 2, 4, 8)
    restore = invariance_hooks.disable_dropout()
    try:
        assert torch.equal(drop(x), x)
        assert torch.equal(F.dropout(x, 0.5, True), x)
        assert torch.equal(torch.dropout(x, 0.5, True), x)
        from torch.nn.functional import dropout as alias_after

        assert torch.equal(alias_after(x, 0.9, True), x)
        a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.9)
        b = F.scaled_dot_product_attention(q, q, q)
        assert torch.equal(a, b)
        assert F.dropout.__name__ == "dropout"  # the wrapped function's name and signature
        assert invariance_hooks.disable_dropout is not None
    finally:
        restore()
    assert not torch.equal(drop(x), x)


def test_install_from_env_seeds() -> None:
    assert invariance_hooks.install_from_env({}) == []
    assert invariance_hooks.install_from_env({"ACCUMGUARD_SEED": "7"}) == ["seed=7"]
    a = torch.rand(3)
    invariance_hooks.install_from_env({"ACCUMGUARD_SEED": "7"})
    assert torch.equal(torch.rand(3), a)


# ----------------------------------------------------------------------------- processes
@pytest.fixture
def no_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    # These commands fail before anything is recorded: the observer's env is not needed.
    monkeypatch.setattr(inv_run, "_observer_env", lambda d, o: {})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_failing_command_reports_exit_code(tmp_path: Path, no_observer: None) -> None:
    opts = InvarianceOptions(command=(sys.executable, "-c",
                                      "import os,sys; sys.exit(3 if os.environ['ACCUMGUARD_K']"
                                      "=='4' else 0)"), ks=(4, 1), steps=1, timeout=60)
    with pytest.raises(CommandFailedError, match=r"K=4: the command exited with code 3") as e:
        inv.run_invariance(opts)
    assert e.value.exit_code == 3 and e.value.k == 4
    # Killed by a signal: named, with the (negative) exit code.
    opts = InvarianceOptions(command=(sys.executable, "-c", "import os, signal; "
                                      "os.kill(os.getpid(), signal.SIGKILL)  # {K}"),
                             ks=(1, 4), steps=1, timeout=60)
    with pytest.raises(CommandFailedError, match=r"K=1: the command was killed by SIGKILL "
                                                 r"\(exit code -9\)"):
        inv.run_invariance(opts)
    # Exits 0 but the observation layer saw nothing (not observed / never stepped).
    opts = InvarianceOptions(command=(sys.executable, "-c", "import os; os.environ['ACCUMGUARD_K']"),
                             ks=(1, 4), steps=1, timeout=60)
    with pytest.raises(CommandFailedError, match="no process of it ran a backward"):
        inv.run_invariance(opts)


_SPAWNER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(120)
"""


def test_timeout_kills_the_whole_group(tmp_path: Path, no_observer: None) -> None:
    pidfile = tmp_path / "pid"
    opts = InvarianceOptions(command=(sys.executable, "-c", _SPAWNER, str(pidfile), "{K}"),
                             ks=(1, 4), steps=1, timeout=3)
    t0 = time.monotonic()
    with pytest.raises(CommandFailedError, match="did not finish within 3 s"):
        inv.run_invariance(opts)
    assert time.monotonic() - t0 < 30
    grandchild = int(pidfile.read_text())
    time.sleep(0.2)
    assert not _alive(grandchild)


def test_sigterm_kills_the_command(tmp_path: Path) -> None:
    """SIGTERM to `accumguard invariance` takes the command and its children down with it."""
    pidfile = tmp_path / "pid"
    code = ("import sys; from accumguard import invariance as inv; "
            "import accumguard.invariance._run as r; "
            "r._observer_env = lambda d, o: {}; "
            "from accumguard.cli.invariance import invariance_main; "
            "sys.exit(invariance_main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "--ks", "1,4", "--", sys.executable,
                             "-c", _SPAWNER, str(pidfile), "{K}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    grandchild = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted (SIGTERM" in err
    time.sleep(0.2)
    assert not _alive(grandchild)


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from accumguard.cli.invariance import invariance_main

    assert invariance_main(["--ks", "1,3", "--batch", "8", "--", sys.executable,
                            str(SCRIPTS / "token_lm.py"), "--accum", "{K}"]) == 2
    assert "not divisible by K=3" in capsys.readouterr().err
    assert invariance_main(["--ks", "1,4", "--", "no-such-trainer-xyz", "{K}"]) == 2
    assert "command not found" in capsys.readouterr().err
    assert invariance_main(["--ks", "1,4"]) == 2
    assert "no command given" in capsys.readouterr().err
    assert invariance_main(["--bogus", "--", "python"]) == 2
    capsys.readouterr()
    plain = SCRIPTS / "no_placeholder.py"
    assert invariance_main(["--ks", "1,4", "--", sys.executable, str(plain)]) == 2
    assert "every K would run the same training" in capsys.readouterr().err


def test_diverged_run_gets_no_correct_claim_beside_its_error(tmp_path: Path) -> None:
    """Issue 23: the watch findings attached to a DIVERGED verdict held a note titled "OK —
    correct large-batch update ... Nothing to fix" beside a real F8 error (update 75 % off).
    The note is titled by its cost; nothing attached says the update is correct."""
    d = tmp_path / "k4"
    d.mkdir()
    step = {"kind": "step", "rank": 0, "step": 0, "backwards": 4, "applied": True,
            "engine": "ddp", "sync_micros": [True] * 4, "clip_micros": [1, 2, 3, 4],
            "clip_functions": ["clip_grad_norm_"], "zero_grads_between": 0,
            "conservation": None}
    (d / "rank-0.jsonl").write_text(json.dumps({"kind": "start", "rank": 0, "world": 1}) + "\n"
                                    + json.dumps(step) + "\n")
    found, text = inv.watch_findings(load_run(d, k=4))
    assert [(f["cls"], f["severity"]) for f in found] == [("F8", "error"),
                                                         ("EXTRA_SYNC", "note")]
    assert "gradients synchronised on every micro-step: 3 extra all-reduce" in text
    assert "correct" not in text.lower() and "nothing to fix" not in text.lower(), text
