"""The checks behind the framework callbacks, in one process (fast): the token-weight probe
recovers each micro-step's weight, classify_window names the pattern, the observation layer
supplies the boundary contract, and nothing of a framework is imported until used."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch

from accumguard.core.errors import AccumulationError
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
from accumguard.integrations._checks import AccumulationChecks, classify_window


def _recs(rows: list[tuple[float, float]]) -> torch.Tensor:
    """Records with weight s and count n: (n, s·d, d) for an arbitrary d."""
    return torch.tensor([[n, s * 0.7 * n, 0.7 * n] for n, s in rows], dtype=torch.float64)


def _cls(ranks: list[list[tuple[float, float]]], k: int = 2) -> str:
    f = classify_window([_recs(r) for r in ranks], world_size=len(ranks),
                        averages_over_ranks=len(ranks) > 1, accumulation_steps=k, step=0)
    return "OK" if f is None else f.class_id


def test_classify_window_names_each_pattern() -> None:
    # Two ranks (DDP averages: an exact loop weights each token W/N before the average).
    n = [[3, 9], [5, 1]]
    total = 18
    assert _cls([[(c, 2 / total) for c in r] for r in n]) == "OK"
    assert _cls([[(c, 1 / (2 * c)) for c in r] for r in n]) == "F5"  # mean per micro-batch / K
    assert _cls([[(c, 1 / sum(r)) for c in r] for r in n]) == "F6"  # rank-local mean
    assert _cls([[(c, 1 / total) for c in r] for r in n]) == "F10"  # DDP average not undone
    assert _cls([[(c, 5 / total) for c in r] for r in n]) == "LOSS_SCALE"
    # One rank, a partial window of 1 micro-step normalised as if K = 4 were there.
    assert _cls([[(7, 1 / 28)]], k=4) == "F7"
    # Equal counts: a mean of means is exact, nothing to report.
    assert _cls([[(4, 1 / 8), (4, 1 / 8)]]) == "OK"


def _train(loss_mode: str, *, k: int = 4, sched_steps: int = 1, zero_inside: bool = False,
           strict: bool = False, every: int = 1, windows: int = 2) -> AccumulationChecks:
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=windows * k)[0]
    checks = AccumulationChecks(model, opt, accumulation_steps=k, scheduler=sched,
                                strict=strict, logits_module=model.fc2, every_n_steps=every)
    try:
        for start in range(0, len(batches), k):
            window = batches[start:start + k]
            total = sum(float(count_tokens(b)) for b in window)
            for i, b in enumerate(window):
                s, n = token_loss(model, b)
                loss = s / total if loss_mode == "exact" else s / n / k
                loss.backward()
                if zero_inside and i == k - 2:
                    opt.zero_grad()
            opt.step()
            for _ in range(sched_steps):
                sched.step()
            opt.zero_grad()
    finally:
        checks.close()
    return checks


@pytest.mark.parametrize(("rescale", "want"), [
    ("exact", []),              # sum the token losses, then grad *= 1/N: exact, silent
    ("twice", ["LOSS_SCALE"]),  # grad *= 2/N: every token weighs 2/N
    ("mean_then_k", ["F5"]),    # per-micro-batch means, grad *= 1/K at the boundary: F5
    ("decay", []),              # grad += wd*p (not one scale): nothing claimed, loss exact
    ("after_clip", []),         # an inactive clip (norm logging) first, then grad *= 1/N
])
@pytest.mark.parametrize("every", [1, 10])
def test_a_rescale_at_the_boundary_is_measured(rescale: str, want: list[str], every: int
                                               ) -> None:
    # Normalising by scaling the accumulated gradient (not the losses) is correct when the
    # scale is 1/N; the probe reads only the backward's weights, the observer measures the
    # scale on the logits weight between the last backward and the clip/step.
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=12)[0]
    with AccumulationChecks(model, opt, accumulation_steps=4, logits_module=model.fc2,
                            every_n_steps=every) as c:
        for start in range(0, len(batches), 4):
            window = batches[start:start + 4]
            total = sum(float(count_tokens(b)) for b in window)
            for b in window:
                s, n = token_loss(model, b)
                (s / n if rescale == "mean_then_k" else s / total if rescale == "decay"
                 else s).backward()
            factor = {"exact": 1 / total, "twice": 2 / total, "mean_then_k": 0.25,
                      "after_clip": 1 / total}.get(rescale)
            if rescale == "after_clip":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            with torch.no_grad():
                for p in model.parameters():
                    if factor is None:
                        p.grad.add_(p, alpha=0.01)
                    else:
                        p.grad.mul_(factor)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e3)  # measured before it
            opt.step()
            opt.zero_grad()
    assert sorted({f.class_id for f in c.findings}) == want, c.findings


def test_probe_exact_loop_has_no_findings_and_mean_of_means_is_f5() -> None:
    ok = _train("exact")
    assert ok.findings == [] and ok.checked_steps == 2
    bad = _train("mean")
    assert [f.class_id for f in bad.findings] == ["F5", "F5"]
    assert "same total weight (0.25)" in bad.findings[0].evidence


def test_sampling_checks_one_step_in_n_and_probes_nothing_in_between() -> None:
    c = _train("mean", every=3, windows=7)
    assert [f.step for f in c.findings] == [1, 6] and c.checked_steps == 2  # observe.sampled
    assert c.steps == 7


def test_bf16_logits_exact_loop_is_not_flagged_and_mean_still_is() -> None:
    def run(mode: str) -> list[str]:
        torch.manual_seed(0)
        model = TokenMLP().to(torch.bfloat16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = make_rank_batches(seed=2, world_size=1, micro_batches=4)[0]
        with AccumulationChecks(model, opt, accumulation_steps=4, logits_module=model.fc2,
                                observe=False) as c:
            total = sum(float(count_tokens(b)) for b in data)
            for b in data:
                s, n = token_loss(model, b)
                (s / total if mode == "exact" else s / n / 4).backward()
            opt.step()
            assert c.probe.low_precision  # judged with the low-precision tolerance
        return [f.class_id for f in c.findings]

    assert run("exact") == []
    assert run("mean") == ["F5"]


def test_scheduler_stepped_twice_is_f4() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = _train("exact", sched_steps=2)
    assert [f.class_id for f in c.findings] == ["F4", "F4"]
    # a plain torch scheduler: the evidence does not blame Accelerate; steps count from 1
    assert [f.step for f in c.findings] == [1, 2]
    assert "Accelerate" not in c.findings[0].evidence and "micro-step loop" in c.findings[0].evidence
    assert "for optimizer step 1 " in c.findings[0].evidence, c.findings[0].evidence


def test_zero_grad_inside_the_window_is_seen_by_the_observation_layer() -> None:
    c = _train("exact", zero_inside=True)
    # The loss weights were right (the probe is silent); the gradient of the first micro-steps
    # was wiped before the step, which only gradient conservation sees.
    assert [f.class_id for f in c.findings] == ["F3", "F3"], c.findings


def test_strict_raises_at_the_first_finding() -> None:
    with pytest.raises(AccumulationError, match="F5"):
        _train("mean", strict=True)


def test_close_removes_every_hook() -> None:
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = (dict(model.fc2._forward_hooks), "step" in vars(sched), torch.Tensor.backward)
    AccumulationChecks(model, opt, accumulation_steps=2, scheduler=sched).close()
    after = (dict(model.fc2._forward_hooks), "step" in vars(sched), torch.Tensor.backward)
    assert before == after
    assert not opt._optimizer_step_post_hooks


def test_integrations_import_no_framework() -> None:
    code = ("import sys, accumguard.integrations, accumguard.integrations.accelerate; "
            "print(sorted(m for m in ('transformers', 'pytorch_lightning', 'lightning', "
            "'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_sampled_checks_keep_conservation_on_the_first_step_and_after_a_reset() -> None:
    # every_n_steps > 1: the conservation checksums run on the sampled steps within a time
    # budget; step 0 is always checked, and a zero_grad inside an unchecked window forces
    # the next windows to be checked whatever the budget.
    from accumguard.observe import _profiles

    c = _train("exact", zero_inside=True, every=3, windows=4)
    assert [f.class_id for f in c.findings][:1] == ["F3"] and c.findings[0].step == 1
    budget = _profiles.CONSERVATION_BUDGET  # the callbacks' profile reads it
    _profiles.CONSERVATION_BUDGET = 0.0  # no time for sampled checks: only step 0 and forced
    try:
        c = _train("exact", zero_inside=True, every=2, windows=6)
    finally:
        _profiles.CONSERVATION_BUDGET = budget
    steps = [f.step for f in c.findings if f.class_id == "F3"]
    assert steps[0] == 1 and len(steps) >= 2, c.findings


def _lm(vocab: int = 16) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab))


def _lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, n: float) -> torch.Tensor:
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             y.reshape(-1), reduction="sum") / n


@pytest.mark.parametrize("bug", [False, True])
def test_a_bug_once_per_epoch_is_judged_on_every_epoch_not_only_sampled_ones(bug: bool) -> None:
    # 7 micro-batches per epoch, K = 2: one micro-step is left over at each epoch's end. The
    # buggy loop zeroes it at the next epoch's start (F7); with every_n_steps = 10 most of
    # those windows are unsampled, and must be judged anyway (their reset is counted
    # without hooks). The correct loop (it steps the leftover at the epoch's end) is silent.
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = _lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randint(0, 16, (7, 5), generator=g),
                                      torch.randint(0, 16, (7, 5), generator=g)), batch_size=1)
    with AccumulationChecks(model, opt, accumulation_steps=2, every_n_steps=10) as c:
        for _epoch in range(6):
            if bug:
                opt.zero_grad()  # wipes the previous epoch's leftover micro-step
            for i, (x, y) in enumerate(loader):
                last = i == len(loader) - 1
                _lm_loss(model, x, y, 5.0 if (last and not bug) else 10.0).backward()
                if (i + 1) % 2 == 0 or (last and not bug):
                    opt.step()
                    opt.zero_grad()
    wrong = sorted({(f.step, f.class_id) for f in c.findings})
    if not bug:
        assert wrong == [] and c.steps == 24
    else:
        assert [s for s, cls in wrong if cls == "F7"] == [4, 7, 10, 13, 16], wrong


def test_two_optimizers_taking_turns_are_both_sampled() -> None:
    # D and G step in turn (observer steps 0, 1, 2, ...); G clips after every micro-step
    # (F8 on every odd step). A phase fixed at step % 10 == 0 would never sample G; the
    # clip before the last backward is counted without hooks, so every G window is judged.
    torch.manual_seed(0)
    d, gen = _lm(), _lm()
    opt_d = torch.optim.SGD(d.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    with AccumulationChecks(d, opt_d, accumulation_steps=2, every_n_steps=10) as c:
        for _ in range(12):
            for _ in range(2):
                _lm_loss(d, torch.randint(0, 16, (2, 5)), torch.randint(0, 16, (2, 5)),
                         20.0).backward()
            opt_d.step()
            opt_d.zero_grad()
            for _ in range(2):
                _lm_loss(gen, torch.randint(0, 16, (2, 5)), torch.randint(0, 16, (2, 5)),
                         20.0).backward()
                torch.nn.utils.clip_grad_norm_(gen.parameters(), 0.01)
            opt_g.step()
            opt_g.zero_grad()
    assert sorted({f.step for f in c.findings if f.class_id == "F8"}) == list(range(2, 25, 2))


class _TiedLM(torch.nn.Module):
    """Logits from the tied embedding (``x @ E.T``): the last ``nn.Linear`` is a hidden
    layer, which find_logits_module() takes for the logits when nothing says otherwise."""

    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.mlp = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mlp(self.embed(x))) @ self.embed.weight.t()


class _ScaledLM(torch.nn.Module):
    """Logits scaled after the output layer (Cohere's logit_scale, Granite's logits_scaling):
    the probed layer's output is not what the cross-entropy reads."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = _lm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(x) * 0.0625


@pytest.mark.parametrize("case", ["tied", "regression", "scaled"])
def test_a_gradient_that_is_not_a_token_cross_entropy_is_not_judged(
        case: str, caplog: pytest.LogCaptureFixture) -> None:
    # Correct loops (the window's sum over its count) whose probed gradient is not that of a
    # token cross-entropy on the probed output: before, read as LOSS_SCALE (blind round 9).
    import logging

    caplog.set_level(logging.INFO, "accumguard")
    torch.manual_seed(0)
    model = {"tied": _TiedLM, "scaled": _ScaledLM}.get(case, lambda: (
        torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))))()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    with AccumulationChecks(model, opt, accumulation_steps=3) as c:
        for _ in range(2):
            rows = [2, 4, 3]  # uneven micro-batches
            total = 5 * sum(rows)
            for r in rows:
                if case == "regression":
                    x, y = torch.randn(r, 3, generator=g), torch.randn(r, 2, generator=g)
                    loss = (model(x) - y).pow(2).sum() / sum(rows)
                else:
                    x = torch.randint(0, 16, (r, 5), generator=g)
                    y = torch.randint(0, 16, (r, 5), generator=g)
                    loss = torch.nn.functional.cross_entropy(
                        model(x).reshape(-1, 16), y.reshape(-1), reduction="sum") / total
                loss.backward()
            opt.step()
            opt.zero_grad()
    assert c.findings == [] and c.checked_steps == 2
    assert sum("not that of a token cross-entropy" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("bug", [False, True])
def test_label_smoothing_is_judged_through_its_smoothed_gradient(
        bug: bool, caplog: pytest.LogCaptureFixture) -> None:
    # Label smoothing changes each token's logits row, not its weight: the window's sum over
    # its count is silent, the mean per micro-batch / K is F5 (before: neither judged, and
    # an info line blamed "not a token cross-entropy").
    import logging

    caplog.set_level(logging.INFO, "accumguard")
    torch.manual_seed(0)
    model = _lm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    with AccumulationChecks(model, opt, accumulation_steps=3) as c:
        for _ in range(2):
            rows = [2, 4, 3]  # uneven micro-batches
            for r in rows:
                x = torch.randint(0, 16, (r, 5), generator=g)
                y = torch.randint(0, 16, (r, 5), generator=g)
                y[0, 3:] = -100
                total = 5 * sum(rows) - 2 * len(rows)
                logits = model(x).reshape(-1, 16)
                if bug:
                    loss = torch.nn.functional.cross_entropy(
                        logits, y.reshape(-1), label_smoothing=0.1) / 3
                else:
                    loss = torch.nn.functional.cross_entropy(
                        logits, y.reshape(-1), reduction="sum", label_smoothing=0.1) / total
                loss.backward()
            opt.step()
            opt.zero_grad()
    assert [f.class_id for f in c.findings] == (["F5", "F5"] if bug else []), c.findings
    assert not any("not that of a token cross-entropy" in r.message for r in caplog.records)


@pytest.mark.parametrize("loop", ["every_micro", "short_last"])
def test_one_backward_windows_f1_when_repeated_f7_when_last(loop: str) -> None:
    # K = 4 declared. "every_micro": the optimizer steps after every micro-step with the loss
    # divided by K (F1; each window of one micro-step also weighs its tokens 1/K, which alone
    # would read as a short window scaled as a full one). "short_last": two full windows and a
    # last window of one micro-step normalised as if it were full (F7, said at close).
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=9)[0]
    windows = [[b] for b in batches[:5]] if loop == "every_micro" else \
        [batches[0:4], batches[4:8], batches[8:9]]
    with AccumulationChecks(model, opt, accumulation_steps=4, logits_module=model.fc2) as c:
        for window in windows:
            n = sum(float(count_tokens(b)) for b in window)
            for b in window:
                s, _ = token_loss(model, b)
                (s / n / 4 if loop == "every_micro" else s / (n * 4 / len(window))).backward()
            opt.step()
            opt.zero_grad()
    got = [(f.step, f.class_id) for f in c.findings]
    assert got == ([(2, "F1")] if loop == "every_micro" else [(3, "F7")]), c.findings


def test_one_backward_of_the_windows_summed_losses_is_not_f1() -> None:
    # K forwards, their token losses summed over the window's count, one backward: correct,
    # and every window is a single backward while K = 4 is declared.
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=12)[0]
    with AccumulationChecks(model, opt, accumulation_steps=4, logits_module=model.fc2) as c:
        for start in range(0, 12, 4):
            window = batches[start:start + 4]
            n = sum(float(count_tokens(b)) for b in window)
            (sum(token_loss(model, b)[0] for b in window) / n).backward()
            opt.step()
            opt.zero_grad()
    assert c.findings == [] and c.checked_steps == 3


@pytest.mark.parametrize("strict", [False, True])
def test_a_held_f7_is_said_once_after_every_hook_is_removed(strict: bool) -> None:
    # summed-loss loop (one backward per window, K forwards) with a short last window of one
    # micro-batch normalised as a full one: F7 (not F1), said at close, after the teardown
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=9)[0]
    c = AccumulationChecks(model, opt, accumulation_steps=4, logits_module=model.fc2,
                           strict=strict)
    for window in (batches[0:4], batches[4:8], batches[8:9]):
        n = sum(float(count_tokens(b)) for b in window)
        (sum(token_loss(model, b)[0] for b in window) / (n * 4 / len(window))).backward()
        opt.step()
        opt.zero_grad()
    if strict:
        with pytest.raises(AccumulationError, match="F7"):
            c.close()
    else:
        c.close()
    c.close()  # idempotent: nothing said twice
    assert [(f.step, f.class_id) for f in c.findings] == [(3, "F7")]
    assert not model.fc2._forward_hooks and not opt._optimizer_step_post_hooks


def test_fix_hints_speak_the_frameworks_terms() -> None:
    from accumguard.integrations import accelerate, lightning, transformers

    c = _train("mean")  # no hints: the generic fix
    assert "accumulator" not in c.findings[0].fix
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=4)[0]
    with AccumulationChecks(model, opt, accumulation_steps=4, logits_module=model.fc2,
                            fix_hints=accelerate.FIX_HINTS) as c:
        for b in batches:
            s, n = token_loss(model, b)
            (s / n / 4).backward()
        opt.step()
    (f,) = c.findings
    assert f.class_id == "F5" and f.fix.endswith(accelerate.FIX_HINTS["F5"]), f.fix
    for hints in (transformers.FIX_HINTS, lightning.FIX_HINTS):
        assert "F5" in hints and "exact" in hints["F5"]


def test_the_inner_scheduler_of_accelerates_wrapper_is_counted_when_called_directly() -> None:
    from accelerate import Accelerator

    accel = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model, opt, sched = accel.prepare(model, opt, sched)
    batches = make_rank_batches(seed=1, world_size=1, micro_batches=4)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with AccumulationChecks(model, opt, accumulation_steps=2, scheduler=sched,
                                logits_module=model.fc2) as c:
            for w in range(2):
                for b in batches[2 * w:2 * w + 2]:
                    s, _ = token_loss(model, b)
                    (s / 40).backward()
                opt.step()
                sched.step()  # the wrapper: one step
                if w == 1:
                    sched.scheduler.step()  # and the inner one by hand: a second
                opt.zero_grad()
    assert [(f.step, f.class_id) for f in c.findings if f.class_id == "F4"] == [(2, "F4")]


def _failing_rank(rank: int, world: int) -> dict:
    """DDP, K = 4, checks every step (a gather per step); accumguard fails on rank 1 only
    (an injected error in the probe's forward hook, at its 6th call: window 2). Run once
    unchecked, once checked: no rank may wait for ever in the checks' gather, and the
    training must not change."""
    import os

    from torch.nn.parallel import DistributedDataParallel as DDP

    from accumguard.observe._failsafe import ENV_FAULT

    def run(checked: bool) -> tuple[list[torch.Tensor], Any]:
        torch.manual_seed(0)
        model = DDP(TokenMLP())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = make_rank_batches(seed=3, world_size=world, micro_batches=16)[rank]
        checks = None
        if checked:
            if rank == 1:
                os.environ[ENV_FAULT] = "hook:_on_forward@6"
            try:
                checks = AccumulationChecks(model, opt, accumulation_steps=4,
                                            logits_module=model.module.fc2)
            finally:
                os.environ.pop(ENV_FAULT, None)
        for i, b in enumerate(data):
            s, n = token_loss(model, b)
            (s / 100).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
        if checks is not None:
            checks.close()
        return [p.detach().clone() for p in model.parameters()], checks

    plain, _ = run(False)
    params, checks = run(True)
    assert checks is not None
    return {"same": all(torch.equal(a, b) for a, b in zip(plain, params, strict=True)),
            "off": checks._off, "failure": None if checks.failure is None
            else checks.failure.error, "checked": checks.checked_steps}


def test_accumguard_failing_on_one_rank_switches_every_ranks_checks_off_without_a_hang(
        ) -> None:
    from accumguard import run_on_ranks

    r0, r1 = run_on_ranks(_failing_rank, 2, timeout=180)
    assert r0["same"] and r1["same"]  # the training is bit-identical to the unchecked run
    assert r0["off"] and r1["off"]  # both dropped their checks at the same gather
    assert r0["failure"] is None and "InjectedFault" in (r1["failure"] or "")
    assert r0["checked"] == r1["checked"] == 1  # window 1 was judged, then the checks stopped
