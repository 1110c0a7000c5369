"""The window-scale rules of the loss record, on real loops run in this process under
``accumguard.watch._recording.recording`` (what ``watch`` installs in each rank) and analysed
as ``watch`` does (blind evaluation round 5: b06, b08, b11).

- LOSS_SCALE: the loss divided by K twice (every window weighs 1/K, the whole loss being
  one call's output times constants); weighted sums of several losses whose weight
  happens to be 1/K stay silent.
- F7: the short last window divided by K instead of its own size (weight n/K while full
  windows weigh 1); the last window normalised by its real size, or dropped, is silent.
- F1: gradients made with ``torch.autograd.grad`` and the optimizer stepped after each
  one; ``autograd.grad`` accumulated over the window, for a gradient penalty
  (``create_graph=True``) or for a logged gradient norm stays silent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.observe import _losses
from accumguard.observe.rules import Finding, analyze, loss_scale_findings, windows
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording

K = 4
C = 6  # classes


@pytest.fixture(autouse=True)
def _record_every_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A toy's windows are cheap, so the loss record's time budget would skip some of
    them; the rules are under test here, not the budget (its own test is in
    test_f5_loss_weights.py)."""
    monkeypatch.setattr(_losses, "_ALWAYS", 10_000)


@dataclass
class _Declared:
    """A K the script declares (what ``watch._declared`` finds in the source)."""

    value: int | None
    divides_loss: bool = True

    @property
    def where(self) -> str:
        return "train.py:3"

    def describe(self) -> str:
        return f"K = {self.value} declared in the script (train.py:3)"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, C)
        self.aux = torch.nn.Linear(16, C)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.head(h), self.aux(h)


def _batch(i: int, rows: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(rows, 8, generator=g), torch.randint(0, C, (rows,), generator=g)


def _analyze(tmp: Path, **kw: Any) -> list[Finding]:
    findings, _, _ = analyze(load_recordings(tmp), **kw)
    return findings


def _errors(findings: list[Finding]) -> set[str]:
    return {f.cls for f in findings if f.severity == "error"}


# -- the loss divided by K twice ---------------------------------------------------------

Loss = Callable[[Net, torch.Tensor, torch.Tensor, int], torch.Tensor]


class _ScaledLoss(torch.nn.Module):
    """A loss wrapper that already divides by K (the first division of b06)."""

    def __init__(self, net: Net) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x)[0], y) / K


def _train(tmp: Path, loss_fn: Loss, *, k: int = K, steps: int = 3) -> list[Finding]:
    net = Net()
    _WRAPPERS[id(net)] = _ScaledLoss(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with recording(tmp):
        for s in range(steps):
            batches = [_batch(s * k + j) for j in range(k)]
            total = sum(len(y) for _, y in batches)
            for x, y in batches:
                loss_fn(net, x, y, total).backward()
            opt.step()
            opt.zero_grad()
    return _analyze(tmp)


_WRAPPERS: dict[int, _ScaledLoss] = {}


def _wrapped(m: Net, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    return _WRAPPERS[id(m)](x, y) / K  # the wrapper divided by K already


def _sum_over_n_over_k(m: Net, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    return F.cross_entropy(m(x)[0], y, reduction="sum") / total / K


def _mse_twice(m: Net, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    return F.mse_loss(m(x)[0], F.one_hot(y, C).float()) / K / K


@pytest.mark.parametrize("loss_fn", [_wrapped, _sum_over_n_over_k, _mse_twice],
                         ids=["wrapper_then_loop", "sum_over_N_over_K", "mse_over_K_K"])
def test_loss_divided_by_k_twice_is_loss_scale(tmp_path: Path, loss_fn: Loss) -> None:
    findings = _train(tmp_path, loss_fn)
    assert _errors(findings) == {"LOSS_SCALE"}, findings
    f = next(f for f in findings if f.cls == "LOSS_SCALE")
    assert "test_losses_scale.py:" in f.evidence
    assert "0.0625 per micro-step" in f.evidence and "0.25 per window (1/K)" in f.evidence
    assert "divided by K twice" in f.evidence and f.step == 1


def _mean_over_k(m: Net, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    return F.cross_entropy(m(x)[0], y) / K


def _two_heads_half(m: Net, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    # K = 2: each head's weight 0.5 / K ... the CE site weighs 1/K per window, but the
    # loss is a sum of two terms (not one call times a constant): not judged
    z, a = m(x)
    return (0.5 * F.cross_entropy(z, y) + 0.5 * F.cross_entropy(a, y)) / 2


def _distill(m: Net, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    z, a = m(x)
    kl = F.kl_div(F.log_softmax(z, -1), F.softmax(a.detach(), -1), reduction="batchmean")
    return (0.25 * F.cross_entropy(z, y) + 0.75 * kl) / K  # alpha = 1/K by chance


def _sum_over_n(m: Net, x: torch.Tensor, y: torch.Tensor, total: int) -> torch.Tensor:
    return F.cross_entropy(m(x)[0], y, reduction="sum") / total


@pytest.mark.parametrize(("loss_fn", "k"), [(_mean_over_k, K), (_sum_over_n, K),
                                            (_two_heads_half, 2), (_distill, K)],
                         ids=["mean_over_k", "sum_over_N", "two_heads_weight_half_K2",
                              "distillation_alpha_1_over_K"])
def test_correct_scales_and_weighted_losses_are_silent(tmp_path: Path, loss_fn: Loss,
                                                       k: int) -> None:
    findings = _train(tmp_path, loss_fn, k=k)
    assert not _errors(findings), findings
    assert not [f for f in findings if f.cls == "LOSS_SCALE"], findings


def test_loss_scale_on_several_ranks_with_w_equal_k_is_a_note() -> None:
    """1/K per window is also a loss divided by K*W before a hand-written all_reduce(SUM)
    when W = K: measured, said, not an error."""
    recs = [["t.py:9", 0, m, 8, 1 / 4 / 8, False, "mean", True, False] for m in range(2)]
    w = {"step": 0, "backwards": 2, "window": 2, "losses": recs}
    assert [f.severity for f in loss_scale_findings(0, windows([w]), 2, world=2)] == ["note"]
    recs = [["t.py:9", 0, m, 8, 1 / 4 / 8, False, "mean", True, False] for m in range(2)]
    w["losses"] = recs
    assert [f.severity for f in loss_scale_findings(0, windows([w]), 2, world=1)] == ["error"]
    # not the whole loss (sole False): silent whatever the weight
    w["losses"] = [[*r[:7], False, False] for r in recs]
    assert loss_scale_findings(0, windows([w]), 2, world=1) == []


def test_loss_scale_with_w_equal_k_under_an_averaging_engine_is_an_error() -> None:
    """Blind round 48, b_b03: DeepSpeed with GA = K = W = 2 and the loss divided by K by hand.
    The engine averages the ranks itself, so the K*W reading (a hand-written SUM) is out:
    the loss is divided by K twice, an error."""
    for engine in ("deepspeed", "ddp", "fsdp2"):
        recs = [["t.py:9", 0, m, 8, 1 / 4 / 8, False, "mean", True, False] for m in range(2)]
        w = {"step": 0, "backwards": 2, "window": 2, "losses": recs, "engine": engine}
        found = loss_scale_findings(0, windows([w]), 2, world=2)
        assert [f.severity for f in found] == ["error"], (engine, found)
        assert "divided by K twice" in found[0].evidence


# -- the short last window divided by K ---------------------------------------------------

def _partial_run(tmp: Path, *, batches: int, how: str, epochs: int = 1, mse: bool = False
                 ) -> list[Finding]:
    """``batches`` micro-batches per epoch, a step every K and at the end of the epoch;
    ``how``: 'k' divides by K (the bug), 'real' by the window's real size, 'drop' skips
    the partial window (and clears it)."""
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*_batch(0, rows=6 * batches)), batch_size=6)
    with recording(tmp):
        for _ in range(epochs):
            for i, (x, y) in enumerate(data):
                start = i - i % K
                size = min(K, batches - start)
                if how == "drop" and size < K:
                    opt.zero_grad()
                    break
                z = net(x)[0]
                loss = (F.mse_loss(z, F.one_hot(y, C).float()) if mse
                        else F.cross_entropy(z, y))
                (loss / (K if how == "k" else size)).backward()
                if (i + 1) % K == 0 or i + 1 == batches:
                    opt.step()
                    opt.zero_grad()
    return _analyze(tmp)


@pytest.mark.parametrize(("epochs", "mse"), [(1, True), (2, False)],
                         ids=["trainer_mse_end_of_run", "ce_every_epoch"])
def test_partial_window_divided_by_k_is_f7(tmp_path: Path, epochs: int, mse: bool) -> None:
    findings = _partial_run(tmp_path, batches=10, how="k", epochs=epochs, mse=mse)
    assert _errors(findings) == {"F7"}, findings
    f = next(f for f in findings if f.cls == "F7")
    assert "2 of K = 4 micro-steps" in f.evidence and "0.5 = 2/4" in f.evidence
    assert f.step == 3 and f.micro == 2
    assert ("end of the run" if epochs == 1 else "end of a pass") in f.evidence


@pytest.mark.parametrize("how", ["real", "drop"])
def test_partial_window_normalised_by_its_size_or_dropped_is_silent(tmp_path: Path,
                                                                    how: str) -> None:
    findings = _partial_run(tmp_path, batches=10, how=how, epochs=2)
    assert not _errors(findings), findings


# -- gradients made with torch.autograd.grad -------------------------------------------------

def _grad_run(tmp: Path, how: str) -> None:
    net = Net()
    params = [p for name, p in net.named_parameters() if not name.startswith("aux")]
    opt = torch.optim.SGD(params, lr=0.1)
    with recording(tmp):
        for s in range(3):
            bufs = [torch.zeros_like(p) for p in params]
            for j in range(K):
                x, y = _batch(s * K + j)
                if how == "penalty":  # WGAN-GP style: create_graph, then a real backward
                    x = x.requires_grad_(True)
                    z = net(x)[0]
                    gx, = torch.autograd.grad(z.sum(), x, create_graph=True)
                    loss = F.cross_entropy(z, y) + ((gx.norm(dim=1) - 1) ** 2).mean()
                    (loss / K).backward()
                    continue
                loss = F.cross_entropy(net(x)[0], y) / K
                if how == "norm_log":  # a logged gradient norm, then the real backward
                    gs = torch.autograd.grad(loss, params, retain_graph=True)
                    float(sum(g.norm() for g in gs))
                    loss.backward()
                    continue
                grads = (torch.autograd.grad(outputs=loss, inputs=params) if how == "kw_step"
                         else torch.autograd.grad(loss, params))
                if how == "accumulate":  # c02: buffers, .grad assigned at the boundary
                    for b, g in zip(bufs, grads, strict=True):
                        b.add_(g)
                    continue
                for p, g in zip(params, grads, strict=True):
                    p.grad = g
                opt.step()
                opt.zero_grad(set_to_none=True)
            if how in ("accumulate",):
                for p, b in zip(params, bufs, strict=True):
                    p.grad = b
            if how in ("accumulate", "penalty", "norm_log"):
                opt.step()
                opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize(("how", "kw"), [("step", {"script": _Declared(K)}),
                                         ("kw_step", {"k_flag": K})],
                         ids=["positional_script_k", "keyword_inputs_flag_k"])
def test_autograd_grad_step_every_micro_step_is_f1(tmp_path: Path, how: str,
                                                   kw: dict[str, Any]) -> None:
    _grad_run(tmp_path, how)
    findings = _analyze(tmp_path, **kw)
    assert _errors(findings) == {"F1"}, findings
    f = next(f for f in findings if f.cls == "F1")
    assert "single torch.autograd.grad" in f.evidence and "0.25 = 1/K" in f.evidence


@pytest.mark.parametrize("how", ["accumulate", "penalty", "norm_log"])
def test_correct_autograd_grad_uses_are_silent(tmp_path: Path, how: str) -> None:
    _grad_run(tmp_path, how)
    for kw in ({}, {"script": _Declared(K)}, {"k_flag": K}):
        findings = _analyze(tmp_path, **kw)
        assert not _errors(findings), (kw, findings)


def test_autograd_grad_without_a_declared_k_is_silent(tmp_path: Path) -> None:
    """A step per autograd.grad is a K = 1 loop unless a K is declared (flag, run, or the
    script): without one, nothing; with the script's K and the loss weighing 1/K, F1."""
    _grad_run(tmp_path, "step")
    assert not _errors(_analyze(tmp_path)), _analyze(tmp_path)
    findings = _analyze(tmp_path, script=_Declared(K, divides_loss=False))
    assert _errors(findings) == {"F1"}, findings  # the measured 1/K weight decides


def test_autograd_grad_over_a_generator_of_parameters_still_gets_its_inputs() -> None:
    # the recorder checks whether the inputs are parameters: it must not use up a generator
    # that torch.autograd.grad then receives empty
    from accumguard.observe import Observer

    model = torch.nn.Linear(3, 2)
    with Observer(auto_roots=True):
        loss = model(torch.randn(4, 3)).sum()
        grads = torch.autograd.grad(loss, model.parameters())
    assert [g.shape for g in grads] == [p.shape for p in model.parameters()]
