"""A window the loop cuts short (an early stop breaking off mid-window, CleanRL's PPO with a
KL target): the micro-steps already taken are either cleared by a ``zero_grad()`` before the
next window (dropped, like drop_last: the next step is the large batch's for its K whole
micro-steps, a warning) or left in ``.grad`` to leak into the next window (an error). Loops
run in this process under ``recording`` (what ``watch`` installs in each rank), no
DataLoader, analysed as ``watch`` does. Round 86 c_b03 and its fixed twin, which got a false
F3 and F7 error before."""

from __future__ import annotations

from pathlib import Path

import torch

from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording

K = 2


def _run(tmp: Path, *, drop: bool) -> list:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with recording(tmp):
        for _ in range(4):  # iterations; each runs 3 micro-batches, K = 2, counter per iteration
            if drop:
                opt.zero_grad()  # drop a window the early stop cut short
            for micro in range(1, 4):
                (model(torch.randn(3, 4, generator=g)).pow(2).mean() / K).backward()
                if micro % K == 0:
                    opt.step()
                    opt.zero_grad()
            # the early stop breaks off here, after micro-step 3 (a half window)
    # (K given as the CLI's --accumulation-steps does; the blind script declared it)
    findings, _, _ = analyze(load_recordings(tmp), k_flag=K)
    return findings


def test_a_cut_short_window_cleared_before_the_next_is_a_warning(tmp_path: Path) -> None:
    findings = _run(tmp_path, drop=True)
    assert not [f for f in findings if f.severity == "error"], findings
    f7 = [f for f in findings if f.cls == "F7"]
    assert f7 and f7[0].severity == "warning", findings
    assert "never trained on" in f7[0].evidence and "K = 2" in f7[0].evidence, f7[0]


def test_a_cut_short_window_left_in_grad_leaks_and_is_an_error(tmp_path: Path) -> None:
    # windows of 3 backward passes at K = 2 after the first: the half window leaked into each
    # next one (no DataLoader pass to tell an epoch's leak from a late boundary: F7 or F13)
    findings = _run(tmp_path, drop=False)
    errors = {f.cls for f in findings if f.severity == "error"}
    assert errors and errors <= {"F7", "F13"}, findings
