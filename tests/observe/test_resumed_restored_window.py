"""A run rebuilt to resume whose first window is short: right when the resume restored the
saved window's gradient into ``.grad`` (the checkpoint held it), an off-by-the-missing-
micro-steps counter when it did not. With several optimizers each has its own window, whose
checksums the resumed run's first window may lack; the observer then reads, at the first
backward of an optimizer made after another had stepped, whether its parameters already
hold a gradient (blind round 70 c_c02, a false F13 error; round 68 c_b02, the bug)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K = 3


def _build() -> tuple[torch.nn.Module, torch.nn.Module, list[torch.optim.Optimizer]]:
    torch.manual_seed(0)
    body, head = torch.nn.Linear(5, 4), torch.nn.Linear(4, 2)
    return body, head, [torch.optim.SGD(body.parameters(), lr=0.1),
                        torch.optim.Adam(head.parameters(), lr=1e-2)]


def _micro(body: torch.nn.Module, head: torch.nn.Module, g: torch.Generator) -> None:
    x, y = torch.randn(4, 5, generator=g), torch.randint(0, 2, (4,), generator=g)
    (F.cross_entropy(head(body(x)), y) / K).backward()


def _run(tmp_path: Path, restore: bool) -> list[Any]:
    g = torch.Generator().manual_seed(1)
    with recording(tmp_path):
        body, head, opts = _build()
        for _ in range(2):
            for _ in range(K):
                _micro(body, head, g)
            for o in opts:
                o.step()
                o.zero_grad()
        _micro(body, head, g)  # one micro-step into the third window: preempted here
        saved = [p.grad.clone() for p in (*body.parameters(), *head.parameters())]
        state = [p.detach().clone() for p in (*body.parameters(), *head.parameters())]
        del body, head, opts
        body, head, opts = _build()  # the resumed run
        with torch.no_grad():
            for p, s, gr in zip((*body.parameters(), *head.parameters()), state, saved,
                                strict=True):
                p.copy_(s)
                if restore:
                    p.grad = gr.clone()
        for n in (K - 1, K, K):  # the counter resumes inside the window
            for _ in range(n):
                _micro(body, head, g)
            for o in opts:
                o.step()
                o.zero_grad()
    found, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [f for f in found if f.severity == "error"]


@pytest.mark.parametrize(("restore", "errors"), [(True, []), (False, ["F13"])],
                         ids=["gradient_restored", "gradient_lost"])
def test_a_short_first_window_after_a_rebuild(tmp_path: Path, restore: bool,
                                              errors: list[str]) -> None:
    found = _run(tmp_path, restore)
    assert sorted({f.cls for f in found}) == errors, found


def _run_one_optimizer(tmp_path: Path, restore: bool) -> list[Any]:
    """One model and one optimizer rebuilt to resume; the gradient is restored (or not) after
    the optimizer was made, as a trainer's ``resume()`` loading the checkpoint does: whether
    ``.grad`` held it is read at the first backward (blind round 80 c_b03_fixed, a false F13
    error; c_b03, the bug)."""
    g = torch.Generator().manual_seed(2)

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def micro(model: torch.nn.Module) -> None:
        x, y = torch.randn(4, 5, generator=g), torch.randint(0, 2, (4,), generator=g)
        (F.cross_entropy(model(x), y) / K).backward()

    with recording(tmp_path):
        model, opt = build()
        for _ in range(2):
            for _ in range(K):
                micro(model)
            opt.step()
            opt.zero_grad()
        micro(model)  # one micro-step into the third window: a checkpoint, then preempted
        saved = {"model": model.state_dict(), "opt": opt.state_dict(),
                 "grads": [p.grad.clone() for p in model.parameters()]}
        del model, opt
        model, opt = build()  # the resumed run: objects first, then the checkpoint
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        if restore:
            for p, gr in zip(model.parameters(), saved["grads"], strict=True):
                p.grad = gr
        for n in (K - 1, K, K):
            for _ in range(n):
                micro(model)
            opt.step()
            opt.zero_grad()
    found, _, _ = analyze(load_recordings(tmp_path), k_flag=K)
    return [f for f in found if f.severity in ("error", "warning") and f.cls == "F13"]


@pytest.mark.parametrize(("restore", "errors"), [(True, []), (False, ["error"])],
                         ids=["gradient_restored", "gradient_lost"])
def test_one_optimizer_rebuilt_then_its_gradient_restored(tmp_path: Path, restore: bool,
                                                          errors: list[str]) -> None:
    found = _run_one_optimizer(tmp_path, restore)
    assert [str(f.severity) for f in found] == errors, found
