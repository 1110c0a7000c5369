"""A per-parameter clip written in a ``register_post_accumulate_grad_hook`` (blind round 100
c_b03, missed before: the hook runs inside the backward, so every measurement bracketing the
backward saw its output only). The hook sees the window's running sum: clipping it on every
micro-step scales the first micro-batches against the later ones (F8). Acting only in the
window's last backward it clips the whole window's sum, which is the large batch's update
(checked against a single-process reference on the full batch); a hook that changes
``.grad`` in a way that is no scalar (a clamp) is not read as a rescale. The wrapper the
observer gives such hooks fails inside its door and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

from accumguard.observe._failsafe import ENV_FAULT
from accumguard.observe._grad_moments import rescaled
from accumguard.observe._records import Finding
from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, STEPS, MAX_NORM, LR = 4, 3, 0.05, 0.1


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(2)
    return [[(torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g))
             for _ in range(K)] for _ in range(STEPS)]


def _clip(p: torch.Tensor) -> None:
    assert p.grad is not None
    n = p.grad.norm()
    if n > MAX_NORM:
        p.grad.mul_(MAX_NORM / (n + 1e-6))


def _loop(form: str) -> list[torch.Tensor]:
    """K micro-steps per step, each loss the micro-batch mean / K; ``form``: the hook clips
    on every micro-step (the bug), only on the window's last (``last``), or clamps."""
    model = _model()
    micro = [0]

    def hook(p: torch.Tensor) -> None:
        if form == "every" or (form == "last" and micro[0] == K - 1):
            _clip(p)
        elif form == "clamp":
            assert p.grad is not None
            p.grad.clamp_(-0.01, 0.01)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for window in _batches():
        for m, (x, y) in enumerate(window):
            micro[0] = m
            (F.cross_entropy(model(x), y) / K).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _reference() -> list[torch.Tensor]:
    """One process, the full effective batch per step, each parameter clipped after it."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for window in _batches():
        x = torch.cat([b[0] for b in window])
        y = torch.cat([b[1] for b in window])
        F.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            _clip(p)
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _update_error(params: list[torch.Tensor]) -> float:
    start = [p.detach() for p in _model().parameters()]
    ref = _reference()
    num = sum(float(((a - s) - (r - s)).norm() ** 2) for a, r, s in zip(params, ref, start, strict=True))
    den = sum(float((r - s).norm() ** 2) for r, s in zip(ref, start, strict=True))
    return (num / den) ** 0.5


def _errors(tmp_path: Path, form: str) -> list[Finding]:
    plain = _loop(form)
    with recording(tmp_path):
        seen = _loop(form)
    assert all(torch.equal(a, b) for a, b in zip(plain, seen, strict=True))
    findings, _, _ = analyze(load_recordings(tmp_path))
    return [f for f in findings if f.severity == "error"]


def test_a_clip_in_the_hook_on_every_micro_step_is_f8(tmp_path: Path) -> None:
    assert _update_error(_loop("every")) > 0.05  # the bug is real
    errors = _errors(tmp_path, "every")
    assert [f.cls for f in errors] == ["F8"], errors
    assert "register_post_accumulate_grad_hook" in errors[0].evidence
    assert "[1, 2, 3]" in errors[0].evidence


def test_a_clip_in_the_hook_on_the_last_micro_step_is_the_large_batch(tmp_path: Path) -> None:
    assert _update_error(_loop("last")) < 1e-5
    assert _errors(tmp_path, "last") == []


def test_a_hook_that_changes_the_gradient_otherwise_is_not_read_as_a_rescale(
        tmp_path: Path) -> None:
    assert [f for f in _errors(tmp_path, "clamp") if f.cls == "F8"] == []


def test_moments_read_as_one_scalar_only_when_both_ratios_agree() -> None:
    t = torch.tensor
    assert rescaled([(0, t([2.0, 1.0, 1.0, 0.5]))]) == [[0.0, 1.0, 1.0, 0.5, 0.5]]
    assert rescaled([(0, t([2.0, 1.0, 1.0, 0.7]))]) is None  # the 4-norm moved otherwise
    assert rescaled([(1, t([2.0, 1.0, 2.0, 1.0]))]) is None  # unchanged
    assert rescaled([(1, t([2.0, 1.0, 0.0, 0.0]))]) is None  # cleared in the hook


def test_gradients_that_are_not_real_floats_are_not_read() -> None:
    from accumguard.observe._grad_moments import moments as _moments

    assert _moments(torch.ones(3, dtype=torch.complex64)) is None
    assert _moments(torch.ones(3, dtype=torch.int64)) is None
    assert _moments(torch.ones(3)) is not None


@pytest.mark.parametrize(("label", "when", "nth"), [
    ("hook:grad_hook_moments", "pre", 3),
    ("Tensor.register_post_accumulate_grad_hook", "pre", 2),
    ("Tensor.register_post_accumulate_grad_hook", "post", 1),
])
def test_a_fault_around_the_grad_hook_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, label: str, when: str,
        nth: int) -> None:
    plain = _loop("every")
    monkeypatch.setenv(ENV_FAULT, f"{label}:{when}@{nth}")
    with recording(tmp_path) as obs:
        params = _loop("every")
        failure = obs.failure
    assert failure is not None, "the injected fault did not fire"
    assert "InjectedFault" in failure.error
    for a, b in zip(params, plain, strict=True):
        assert torch.equal(a, b), f"{label}:{when}@{nth} changed the training"


def test_a_librarys_hook_is_registered_unwrapped() -> None:
    """A hook whose function a library defines (torch's own, or a functools.partial of one)
    is handed to torch as it is."""
    import functools

    from accumguard.observe._grad_hooks import _measured

    lib = functools.partial(torch.nn.utils.clip_grad_norm_, max_norm=1.0)
    assert _measured(None, lib) is lib  # type: ignore[arg-type]
    assert _measured(None, torch.nn.utils.clip_grad_norm_) is torch.nn.utils.clip_grad_norm_  # type: ignore[arg-type]
