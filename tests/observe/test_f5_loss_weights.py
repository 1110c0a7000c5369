"""F5 seen by the observation layer alone: the loss record (cross_entropy/nll_loss patched
where torch defines them) and the per-window rule. Every loop runs in this process under
``accumguard.watch._recording.recording`` (what ``watch`` installs in each rank) and is
analysed as ``watch`` does. The broken loop (token mean per micro-batch / K over uneven
counts) must be an F5 error; every correct pattern must stay silent (a false alarm costs
more than a miss)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.observe import Observer
from accumguard.observe.rules import (
    Finding,
    RunRecording,
    analyze,
    loss_weight_findings,
    windows,
)
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording

V = 16
K = 4
Loss = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, 8)
        self.head = torch.nn.Linear(8, V)
        self.aux = torch.nn.Linear(8, V)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(x)
        return self.head(h).reshape(-1, V), self.aux(h).reshape(-1, V)


def _batch(i: int, *, uneven: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    x = torch.randint(0, V, (2, 10), generator=g)
    y = x.clone()
    if uneven:
        y[:, 2 + 3 * (i % 3):] = -100  # 4, 10 or 16 valid tokens per micro-batch
    else:
        y[:, 5:] = -100
    return x, y.reshape(-1)


def _count(y: torch.Tensor) -> int:
    return int((y != -100).sum())


def _run(tmp: Path, loss_fn: Loss, *, k: int = K, steps: int = 2, uneven: bool = True,
         eval_between: bool = False) -> list[Finding]:
    """Train ``steps`` windows of ``k`` micro-steps; ``loss_fn(logits, labels, n_i, N)``."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording(tmp):
        for s in range(steps):
            batches = [_batch(s * k + j, uneven=uneven) for j in range(k)]
            total = sum(_count(y) for _, y in batches)
            for x, y in batches:
                logits, _ = model(x)
                loss_fn(logits, y, _count(y), total).backward()
                if eval_between:
                    with torch.no_grad():
                        F.cross_entropy(model(x)[0], y)  # eval: no grad, not recorded
            opt.step()
            opt.zero_grad()
    findings, _, _ = analyze(load_recordings(tmp))
    return findings


def _errors(findings: list[Finding]) -> set[str]:
    return {f.cls for f in findings if f.severity == "error"}


def test_a_reduction_none_loss_reduced_to_the_micro_batch_mean_is_f5_too(tmp_path: Path) -> None:
    # per-token losses summed and divided by this micro-batch's count, then by K: the same
    # mean of means (this test once called it "user-weighted, not judged": the per-token
    # output was not recorded; its gradient is one value per valid token, now read)
    findings = _run(tmp_path, lambda z, y, n, total: F.cross_entropy(z, y, reduction="none").sum() / n / K)
    assert _errors(findings) == {"F5"}, findings


def test_token_mean_over_k_with_uneven_counts_is_f5(tmp_path: Path) -> None:
    findings = _run(tmp_path, lambda z, y, n, total: F.cross_entropy(z, y) / K)
    assert _errors(findings) == {"F5"}, findings
    f5 = next(f for f in findings if f.cls == "F5")
    # the user's line, the counts, the equal total weight per micro-step, and the fix
    assert "test_f5_loss_weights.py:" in f5.evidence
    assert "4, 10, 16, 4 valid tokens" in f5.evidence and "(0.25)" in f5.evidence
    assert f5.step == 1 and "window's total count N" in f5.fix


@pytest.mark.parametrize("name", ["sum_over_N", "mean_times_n_over_N", "equal_counts",
                                  "k1", "eval_no_grad", "task_weights",
                                  "autograd_grad"])
def test_correct_patterns_are_silent(tmp_path: Path, name: str) -> None:
    kw: dict[str, Any] = {}
    fn: Loss
    if name == "sum_over_N":
        def fn(z: Any, y: Any, n: int, total: int) -> Any:
            return F.cross_entropy(z, y, reduction="sum") / total
    elif name == "mean_times_n_over_N":
        def fn(z: Any, y: Any, n: int, total: int) -> Any:
            return F.cross_entropy(z, y) * n / total
    elif name == "equal_counts":  # nanoGPT: mean / K is exact when every count is equal
        def fn(z: Any, y: Any, n: int, total: int) -> Any:
            return F.cross_entropy(z, y) / K
        kw["uneven"] = False
    elif name == "k1":
        def fn(z: Any, y: Any, n: int, total: int) -> Any:
            return F.cross_entropy(z, y)
        kw["k"] = 1
        kw["steps"] = 4
    elif name == "eval_no_grad":
        def fn(z: Any, y: Any, n: int, total: int) -> Any:
            return F.cross_entropy(z, y, reduction="sum") / total
        kw["eval_between"] = True
    elif name == "autograd_grad":  # a token mean / K differentiated by autograd.grad only
        def fn(z: Any, y: Any, n: int, total: int) -> Any:
            torch.autograd.grad(F.cross_entropy(z, y) / K, z, retain_graph=True)
            return F.cross_entropy(z, y, reduction="sum") / total
    else:  # a weight per micro-batch (task weights) on equal counts: not a count pattern
        weights = iter([1.0, 0.5, 2.0, 0.3] * 4)

        def fn(z: Any, y: Any, n: int, total: int) -> Any:
            return F.cross_entropy(z, y) * next(weights) / K
        kw["uneven"] = False
    findings = _run(tmp_path, fn, **kw)
    assert not _errors(findings), findings


def test_heads_losses_not_backpropagated_and_module_losses(tmp_path: Path) -> None:
    """Two heads with different weights per head, both exact, plus a per-batch mean that is
    only logged (never backpropagated): silent. The same heads through
    ``nn.CrossEntropyLoss`` with the aux head as a per-micro-batch mean: F5, named at the
    user's line (not torch's loss module)."""
    ce = torch.nn.CrossEntropyLoss(reduction="sum")
    ce_mean = torch.nn.CrossEntropyLoss()

    def run(tmp: Path, broken: bool) -> list[Finding]:
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with recording(tmp):
            for s in range(2):
                batches = [_batch(s * K + j) for j in range(K)]
                total = sum(_count(y) for _, y in batches)
                for x, y in batches:
                    a, b = model(x)
                    logged = F.cross_entropy(a, y)  # a metric: never backpropagated
                    aux = ce_mean(b, y) / K if broken else 0.3 * ce(b, y) / total
                    (ce(a, y) / total + aux).backward()
                    del logged
                opt.step()
                opt.zero_grad()
        return analyze(load_recordings(tmp))[0]

    assert not _errors(run(tmp_path / "ok", False))
    findings = run(tmp_path / "bad", True)
    assert _errors(findings) == {"F5"}, findings
    f5 = next(f for f in findings if f.cls == "F5")
    assert "test_f5_loss_weights.py:" in f5.evidence and "loss.py" not in f5.evidence


def test_grad_scaler_and_alias_after_install(tmp_path: Path) -> None:
    """A GradScaler's constant factor cancels (only ratios inside one window count); a
    ``from torch.nn.functional import cross_entropy`` made after install is the patch."""
    for broken in (False, True):
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        out = tmp_path / str(broken)
        with recording(out):
            from torch.nn.functional import cross_entropy  # bound under the observer

            for s in range(2):
                batches = [_batch(s * K + j) for j in range(K)]
                total = sum(_count(y) for _, y in batches)
                for x, y in batches:
                    z, _ = model(x)
                    loss = (cross_entropy(z, y) / K if broken
                            else cross_entropy(z, y, reduction="sum") / total)
                    scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        errors = _errors(analyze(load_recordings(out))[0])
        assert errors == ({"F5"} if broken else set()), (broken, errors)


def test_patch_keeps_signature_and_goes_away() -> None:
    before = F.cross_entropy, F.nll_loss
    sig = inspect.signature(F.cross_entropy)
    with Observer(auto_roots=True):
        assert F.cross_entropy is not before[0]
        assert inspect.signature(F.cross_entropy) == sig
        x = torch.randn(3, 4, requires_grad=True)
        torch.autograd.grad(F.cross_entropy(x, torch.tensor([0, 1, 2])), x)  # no listener
    assert (F.cross_entropy, F.nll_loss) == before


def _window(step: int, weights: list[float], counts: list[int], *, low: bool = False,
            site: str = "train.py:10") -> dict[str, Any]:
    return {"step": step, "window": len(weights), "backwards": len(weights), "applied": True,
            "losses": [[site, 0, i, n, w, low, "mean"]
                       for i, (w, n) in enumerate(zip(weights, counts, strict=True))]}


def test_rule_tolerances_and_cross_rank_note() -> None:
    """Rounding-level differences never count; the F5 signature needs equal total weight
    per micro-step; differences only across ranks (each rank by its own count) are F6 (the
    loss-weight ledger's), not F5."""
    counts = [100, 103, 97, 100]
    exact = [1 / 400 * (1 + e) for e in (0, 1e-7, -1e-7, 3e-8)]  # fp32 rounding of 1/N
    assert not loss_weight_findings(0, windows([_window(0, exact, counts)]))
    f5 = [0.25 / n for n in counts]
    assert [f.cls for f in loss_weight_findings(0, windows([_window(0, f5, counts)]))] == ["F5"]
    # bf16 rounding of the total weight (~0.4 %) with 3 % count spread: not certain, silent
    noisy = [0.25 * (1 + e) / n for e, n in zip((0, 4e-3, -4e-3, 2e-3), counts, strict=True)]
    assert not loss_weight_findings(0, windows([_window(0, noisy, counts, low=True)]))
    # one weight per rank, different across ranks (each rank divides by its own count)
    rec = RunRecording(world=2)
    rec.steps = {0: [_window(0, [1 / 400] * 4, counts)],
                 1: [_window(0, [1 / 300] * 4, [75] * 4)]}
    findings = analyze(rec)[0]
    # the loss-weight ledger: the ranks' tokens weigh 1.33x apart
    assert [(f.cls, f.severity) for f in findings] == [("F6", "error")], findings


def test_windows_that_are_not_one_accumulation_window_are_not_judged() -> None:
    """A zero_grad between backwards (F3, or a GradScaler skip seen as one long window), or
    a DeepSpeed step that discarded its gradients (overflow: the recorder restarts its
    micro-steps, so the folded window lacks its first records): silent. A torch step with
    every gradient None changes nothing: its micro-steps stay in the window."""
    counts = [100, 100, 50, 50]
    f5 = [0.25 / n for n in counts]
    spliced = _window(0, f5, counts)
    spliced["zero_grads_between"] = 1
    assert not loss_weight_findings(0, windows([spliced]))
    noop = {"step": 0, "backwards": 2, "applied": False}
    rec = RunRecording()
    after = _window(1, f5[2:], counts[2:])  # micro-steps 0, 1 of a folded window of 4
    rec.steps = {0: [noop, after]}
    assert not analyze(rec)[0]
    carried = _window(1, f5, counts)  # carried across the no-op step: micro-steps 0..3
    carried["backwards"] = 2
    rec.steps = {0: [noop, carried]}
    assert [f.cls for f in analyze(rec)[0]] == ["F5"]


def test_recorder_drops_a_discarded_window() -> None:
    model = Net()
    obs = Observer(auto_roots=True)
    obs.add_listener(type("L", (), {"on_step": lambda self, ev: None})())
    with obs:
        for i in range(2):
            x, y = _batch(i)
            F.cross_entropy(model(x)[0], y).backward()
        assert len(obs.losses.calls) == 2 and obs.losses.micro == 2
        assert obs.losses.take(False) is None and obs.losses.micro == 2  # carried
        assert obs.losses.take(False, carry=False) is None
        assert obs.losses.calls == [] and obs.losses.micro == 0


@pytest.mark.parametrize("kind", ["nll_loss", "soft_targets", "bf16_autocast",
                                  "label_smoothing", "mse_loss"])
def test_other_loss_forms(tmp_path: Path, kind: str) -> None:
    """``nll_loss`` on log-probabilities, probability targets (the count is the rows: the
    batch size varies), bf16 autocast and label smoothing: the mean / K is F5, the sum / N
    is silent. The evidence names what the count counts: tokens (class targets), samples
    (probability targets), elements (``mse_loss``)."""
    unit = {"soft_targets": "samples", "mse_loss": "elements"}.get(kind, "tokens")
    for broken in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = tmp_path / str(broken)
        with recording(out):
            for s in range(2):
                g = torch.Generator().manual_seed(s)
                rows = [3, 7, 2, 5]
                xs = [torch.randn(r, 6, generator=g) for r in rows]
                ys = [torch.randint(0, 5, (r,), generator=g) for r in rows]
                if kind == "mse_loss":
                    ys = [torch.randn(r, 5, generator=g) for r in rows]
                elif kind != "soft_targets":
                    for y in ys:
                        y[: len(y) // 2] = -100  # uneven valid counts (and rows)
                total = (sum(rows) if kind == "soft_targets" else
                         sum(5 * r for r in rows) if kind == "mse_loss" else
                         sum(int((y != -100).sum()) for y in ys))
                for x, y in zip(xs, ys, strict=True):
                    red = "mean" if broken else "sum"
                    scale = 1 / K if broken else 1 / total
                    if kind == "nll_loss":
                        loss = F.nll_loss(torch.log_softmax(model(x), -1), y, reduction=red)
                    elif kind == "soft_targets":
                        p = torch.softmax(torch.randn(len(y), 5, generator=g), -1)
                        loss = F.cross_entropy(model(x), p, reduction=red)
                    elif kind == "mse_loss":
                        loss = F.mse_loss(model(x), y, reduction=red)
                    elif kind == "label_smoothing":
                        loss = F.cross_entropy(model(x), y, reduction=red, label_smoothing=0.1)
                    else:
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            loss = F.cross_entropy(model(x), y, reduction=red)
                    (loss * scale).backward()
                opt.step()
                opt.zero_grad()
        found = analyze(load_recordings(out))[0]
        assert _errors(found) == ({"F5"} if broken else set()), (kind, broken, found)
        if broken:
            f5 = next(f for f in found if f.cls == "F5")
            assert f" valid {unit} in the " in f5.evidence, f5.evidence
            assert {"tokens", "samples", "elements"} - {unit} & set(f5.evidence.split()) == set()


def test_budget_keeps_the_first_windows(tmp_path: Path) -> None:
    """Cost control: the first windows are always recorded; past its time budget the record
    skips windows (no per-call work) and F5 is still found from the recorded ones."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording(tmp_path) as obs:
        for s in range(5):
            for j in range(K):
                x, y = _batch(s * K + j)
                (F.cross_entropy(model(x)[0], y) / K).backward()
            opt.step()
            opt.zero_grad()
            obs.losses.spent = 1e9  # over budget from now on
    rec = load_recordings(tmp_path)
    recorded = [bool(s.get("losses")) for s in rec.steps[0]]
    from accumguard.observe._losses import _ALWAYS

    assert _ALWAYS == 4  # two spans of a normaliser over two optimizer steps (test_term_rules)
    assert recorded == [True] * _ALWAYS + [False] * (5 - _ALWAYS), recorded
    assert _errors(analyze(rec)[0]) == {"F5"}


def test_budget_counts_the_walk_below_each_root(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's cost counted against its budget is all of it: the walk below each
    backward's root (and the gradient hooks), not only the loss calls and the step's
    transfer. A walk that takes 20 ms shows in ``spent`` once per recorded backward."""
    import time

    from accumguard.observe import _losses

    walk = _losses.walk

    def slow_walk(root: object, stops: frozenset[int] = frozenset()) -> object:
        time.sleep(0.02)
        return walk(root, stops)

    monkeypatch.setattr(_losses, "walk", slow_walk)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with recording(tmp_path) as obs:
        for j in range(K):  # the first window: always recorded
            x, y = _batch(j)
            (F.cross_entropy(model(x)[0], y) / K).backward()
        spent = obs.losses.spent
        opt.step()
        opt.zero_grad()
    assert spent >= 0.02 * K, spent


@pytest.mark.parametrize(("divisor", "says"), [
    (K, "a per-micro-batch mean divided by K"),
    (1, f"not divided by K either, so the window's gradient is also {K}x"),
    (2 * K, "a per-micro-batch mean scaled by 0.125"),
])
def test_f5_evidence_names_how_the_mean_was_scaled(tmp_path: Path, divisor: int, says: str
                                                  ) -> None:
    """The evidence must not claim '/K' when the loop did not divide (a transformers
    Trainer skips its own /K for a compute_loss override that ignores num_items_in_batch)."""
    findings = _run(tmp_path, lambda z, y, n, total: F.cross_entropy(z, y) / divisor)
    f5 = [f for f in findings if f.cls == "F5" and f.severity == "error"]
    assert f5 and says in f5[0].evidence, [f.evidence for f in findings]


@pytest.mark.parametrize("divisor", [K, 1])
def test_an_undivided_mean_is_also_the_loss_scale(tmp_path: Path, divisor: int) -> None:
    """Blind round 49 a_b01: per-micro-batch means never divided by K (an HF Trainer
    skipping its /K for a compute_loss that ignores num_items_in_batch) weigh K in all: the
    title must not say "/ K", and the K x scale is an error of its own (LOSS_SCALE)."""
    findings = _run(tmp_path, lambda z, y, n, total: F.cross_entropy(z, y) / divisor)
    errors = {f.cls: f for f in findings if f.severity == "error"}
    if divisor == 1:
        assert set(errors) == {"F5", "LOSS_SCALE"}, findings
        assert "/ K" not in errors["F5"].title and "not divided by K" in errors["F5"].title
        assert f"loss {K}x too large" in errors["LOSS_SCALE"].title
    else:
        assert set(errors) == {"F5"}, findings
