"""The observation layer on its own (single process, tiny models): one event per hook kind,
patches gone on exit with the wrapped signatures kept, clipping seen through an alias bound
before install, a step whose gradients are all None recorded as not applied, backward
attribution to the watched model, and the conservation verdict."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import torch
from torch.nn.utils import clip_grad_norm_ as early_alias  # bound before any Observer exists

from accumguard.observe import Observer, rules


class Recorder:
    """A listener that keeps every event by method name."""

    def __init__(self) -> None:
        self.events: dict[str, list[Any]] = {}

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda ev: self.events.setdefault(name, []).append(ev)

    def kinds(self) -> set[str]:
        return set(self.events)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return model(torch.randn(3, 4, generator=g)).pow(2).mean()


def _observe(model: torch.nn.Module, **kw: Any) -> tuple[Observer, Recorder]:
    obs = Observer(roots=[model], **kw)
    rec = Recorder()
    obs.add_listener(rec)
    return obs, rec


def test_one_event_per_hook_kind() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    scaler = torch.amp.GradScaler("cpu")
    obs, rec = _observe(model)
    with obs:
        scaler.scale(_loss(model, 0)).backward()  # Tensor.backward
        torch.autograd.backward(scaler.scale(_loss(model, 1)))  # torch.autograd.backward
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        scaler.update()
        sched.step()
        opt.zero_grad()
        model.zero_grad()
    assert rec.kinds() >= {"on_forward", "on_backward_start", "on_backward", "on_unscale",
                           "on_clip", "on_step_start", "on_step", "on_scaler_update",
                           "on_scheduler_step", "on_zero_grad"}
    assert [b.source for b in rec.events["on_backward"]] == ["tensor", "autograd"]
    assert len(rec.events["on_forward"]) == 2
    (step,) = rec.events["on_step"]
    assert (step.backwards, step.applied, step.clips, step.clip_micros) == (2, True, 1, [2])
    (start,) = rec.events["on_step_start"]
    assert start.owner is opt and start.applied and start.source == "torch"
    assert start.conservation is not None and start.conservation.ok
    assert [z.kind for z in rec.events["on_zero_grad"]] == ["optimizer", "module"]
    assert rec.events["on_scheduler_step"][0].owner is sched
    assert [e.kind for e in rec.events["on_unscale"] + rec.events["on_scaler_update"]] == [
        "unscale", "update"]


def test_patches_are_removed_and_signatures_kept() -> None:
    targets = [(torch.Tensor, "backward"), (torch.autograd, "backward"),
               (torch.optim.Optimizer, "zero_grad"), (torch.nn.Module, "zero_grad"),
               (torch.optim.lr_scheduler.LRScheduler, "step"),
               (torch.nn.utils, "clip_grad_norm_"), (torch.nn.utils.clip_grad, "clip_grad_norm_"),
               (torch.nn.utils.clip_grad, "_clip_grads_with_norm_"),
               (torch.amp.GradScaler, "unscale_"), (torch.amp.GradScaler, "update")]
    before = {(id(o), n): getattr(o, n) for o, n in targets}
    own = {(id(o), n): n in vars(o) for o, n in targets}
    sigs = {(id(o), n): inspect.signature(getattr(o, n)) for o, n in targets}
    model = _model()
    with Observer(roots=[model], attribute=True):
        for o, n in targets:
            assert getattr(o, n) is not before[id(o), n], n  # wrapped while installed
            assert inspect.signature(getattr(o, n)) == sigs[id(o), n], n
        # Accelerate checks this parameter before calling zero_grad(set_to_none=...)
        assert "set_to_none" in inspect.signature(torch.optim.Optimizer.zero_grad).parameters
    for o, n in targets:
        assert getattr(o, n) is before[id(o), n], n
        assert (n in vars(o)) == own[id(o), n], n
    assert not model._forward_pre_hooks and not model._forward_hooks
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    assert not _global_optimizer_pre_hooks


def test_clip_through_an_alias_bound_before_install_is_seen() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    obs, rec = _observe(model)
    with obs:
        _loss(model, 0).backward()
        early_alias(model.parameters(), 1.0)  # the original function object
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the patched name: once
        opt.step()
    clips = rec.events["on_clip"]
    assert len(clips) == 2 and all(c.function == "clip_grad_norm_" for c in clips)
    assert {id(p) for p in clips[0].params} == {id(p) for p in model.parameters()}


def test_step_with_every_gradient_none_is_not_applied() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    obs, rec = _observe(model)
    with obs:
        opt.step()  # no backward: every .grad is None, AdamW skips every parameter
        _loss(model, 0).backward()
        opt.step()
    first, second = rec.events["on_step"]
    assert (first.applied, first.backwards) == (False, 0)
    assert (second.applied, second.backwards) == (True, 1)
    assert [s.applied for s in rec.events["on_step_start"]] == [False, True]


def test_a_step_whose_closure_makes_the_gradient_is_applied_and_its_update_recorded() -> None:
    """Issue 23: Lightning (automatic optimisation) runs forward and backward in the closure
    it passes to ``optimizer.step``, after the step's pre-hook. At K=1 the first step found
    every .grad None there, was recorded as not applied, and its update was lost: invariance
    then compared step 1 against nothing ("updated only at K=4", difference inf)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # as under watch/invariance: the roots (and the parameters' names) are learned at the
    # first backward, which here runs inside the first step
    obs = Observer(auto_roots=True, record_updates=True)
    rec = Recorder()
    obs.add_listener(rec)
    before = [p.detach().clone() for p in model.parameters()]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _loss(model, 0)
        loss.backward()
        return loss

    with obs:
        opt.step(closure)
        opt.step(closure=closure)
    first, second = rec.events["on_step"]
    assert (first.applied, first.backwards) == (True, 1)
    assert second.applied and second.backwards == 1
    assert first.updates is not None and set(first.updates) == {"0.weight", "0.bias",
                                                                "2.weight", "2.bias"}
    moved = [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]
    total = sum(first.updates[n] + second.updates[n] for n in ("0.weight",))
    assert torch.allclose(total.float(), moved[0], atol=1e-6)
    # a closure that makes no gradient (all None after it too) is still not applied
    opt2 = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    obs2, rec2 = _observe(model)
    with obs2:
        opt2.step(lambda: None)
    assert [e.applied for e in rec2.events["on_step"]] == [False]


def test_attribution_marks_backwards_of_the_watched_model_only() -> None:
    gen, disc = _model(), torch.nn.Linear(2, 1)

    class Wrapped(torch.nn.Module):  # returns a plain object holding the tensors
        def __init__(self) -> None:
            super().__init__()
            self.net = gen

        def forward(self, x: torch.Tensor) -> SimpleNamespace:
            return SimpleNamespace(out=self.net(x), extra="text")

    root = Wrapped()
    obs, rec = _observe(root, attribute=True)
    with obs:
        fake = root(torch.randn(3, 4)).out
        disc(fake.detach()).sum().backward()  # does not reach the root's output
        disc(fake).sum().backward()  # does
    assert [b.reached for b in rec.events["on_backward"]] == [False, True]
    assert [b.forwards for b in rec.events["on_backward"]] == [1, 0]


def test_conservation_verdict_for_zero_grad_inside_the_window() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    obs, rec = _observe(model)
    with obs:
        for bug in (False, True):
            for i in range(3):
                _loss(model, i).backward()
                if bug and i < 2:
                    opt.zero_grad()
            opt.step()
            opt.zero_grad()
    ok, broken = [s.conservation for s in rec.events["on_step_start"]]
    assert ok.ok and ok.wiped == 0.0
    assert not broken.ok and broken.reason == "wiped" and broken.first_wipe == 1
    assert rec.events["on_step"][1].zero_grads_between == 2
    # every clear is kept, and what was lost is measured on |g| (the linear checksums' signed
    # terms cancel: `wiped` understates it); backward passes 1-2 of 3 similar ones were lost
    assert broken.wipes == (1, 2) and ok.wipes == () and ok.lost == 0.0
    assert 0.4 < broken.lost < 0.9 and broken.lost > broken.wiped
    text = rules.live_findings(rules.step_record(rec.events["on_step"][1], 0), rank=0, k=3)
    assert "before backward pass(es) 2, 3 of 3" in text[0].evidence, text
    assert "accumulated by backward passes 1-2, was removed" in text[0].evidence


def test_a_zero_grad_in_the_middle_of_every_window_is_f3_in_every_window() -> None:
    # zero_grad after backward 2 of 4 (not after the step): from the second window on, the
    # window starts on a leftover (passes 3-4 of the previous one) that the misplaced clear
    # removes with passes 1-2: the leftover never reaches the optimizer, so not F7 (stale)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    obs, rec = _observe(model)
    with obs:
        for w in range(3):
            for i in range(4):
                _loss(model, 4 * w + i).backward()
                if i == 1:
                    opt.zero_grad()
            opt.step()
    cons = [s.conservation for s in rec.events["on_step_start"]]
    assert [c.reason for c in cons] == ["wiped"] * 3, cons
    assert cons[0].stale == 0.0 < cons[1].stale and all(c.wipes == (2,) for c in cons)
    assert all(0.2 < c.lost < 0.8 for c in cons), [c.lost for c in cons]  # about half
    found = [rules.live_findings(rules.step_record(e, 0), rank=0, k=4)
             for e in rec.events["on_step"]]
    assert [[f.cls for f in fs] for fs in found] == [["F3"]] * 3, found
    assert "before backward pass(es) 3 of 4" in found[1][0].evidence
    assert "accumulated by backward passes 1-2, was removed" in found[1][0].evidence


def test_a_gradient_moved_aside_and_restored_is_conserved_and_nothing_lost() -> None:
    # an fp32 gradient buffer: .grad moved aside after each backward, the sum put back
    # before the step (correct); the clears are facts, nothing was lost
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    obs, rec = _observe(model)
    buf = [torch.zeros_like(p) for p in model.parameters()]
    with obs:
        for i in range(3):
            _loss(model, i).backward()
            for b, p in zip(buf, model.parameters(), strict=True):
                b += p.grad
                p.grad = None
        for b, p in zip(buf, model.parameters(), strict=True):
            p.grad = b.clone()
        opt.step()
    (cons,) = [s.conservation for s in rec.events["on_step_start"]]
    assert cons.ok and cons.lost == 0.0 and cons.wipes == (1, 2), cons


def test_auto_roots_pin_the_modules_seen_at_the_top_level() -> None:
    """``watch`` (auto_roots) swaps its global forward pre-hook, which sends every submodule
    call down torch's hooked path, for hooks on the modules seen at the top level once
    PIN_ROOTS_AFTER_STEPS steps ran; forwards are counted the same before and after, and
    uninstall leaves no hook behind."""
    from torch.nn.modules import module as mm

    from accumguard.observe._observer import PIN_ROOTS_AFTER_STEPS

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = len(mm._global_forward_pre_hooks)
    forwards: list[list[int]] = []

    class Steps:
        def on_step(self, ev: Any) -> None:
            forwards.append(list(ev.forwards))

    obs = Observer(auto_roots=True)
    obs.add_listener(Steps())
    with obs:
        assert len(mm._global_forward_pre_hooks) == before + 1
        for _ in range(PIN_ROOTS_AFTER_STEPS + 2):
            for _ in range(2):
                model(torch.ones(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        assert len(mm._global_forward_pre_hooks) == before  # pinned
        assert len(model._forward_pre_hooks) == 1 and not model[0]._forward_pre_hooks
    assert forwards == [[1, 1]] * (PIN_ROOTS_AFTER_STEPS + 2)
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert len(mm._global_forward_pre_hooks) == before


def test_scheduler_events_exclude_the_constructor_step_and_see_overridden_steps() -> None:
    """Issue 23: the scheduler count never holds the constructor's own step (torch's
    _initial_step, also made by SequentialLR for its first scheduler), and a scheduler
    whose class overrides step() is counted once per call of it."""
    import torch.optim.lr_scheduler as lrs

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    obs, rec = _observe(model)
    with obs:
        lam = lrs.LambdaLR(opt, lambda s: 1.0)
        warm = lrs.CosineAnnealingWarmRestarts(opt, 3)
        seq = lrs.SequentialLR(opt, [lrs.LambdaLR(opt, lambda s: 0.5), lrs.StepLR(opt, 2)],
                               milestones=[1])
        assert "on_scheduler_step" not in rec.events  # three constructors, no step
        _loss(model, 0).backward()
        opt.step()
        for s in (lam, warm, seq, seq):
            s.step()
    got = [(type(e.owner).__name__, e.count, e.optimizer_steps)
           for e in rec.events["on_scheduler_step"]]
    assert got == [("LambdaLR", 1, 1), ("CosineAnnealingWarmRestarts", 1, 1),
                   ("SequentialLR", 1, 1), ("SequentialLR", 2, 1)], got
