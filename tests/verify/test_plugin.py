"""The pytest plugin: loaded through the ``pytest11`` entry point (a subprocess pytest run
with no ``-p`` option sees its fixtures), its guard fixture fails known-broken loops and
passes correct ones, and the equivalence helper (built on the audit) does the same on
2 real gloo ranks."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
from accumguard.verify.contract import AuditSetup, LoopContext
from accumguard.verify.testing import NotEquivalentError, assert_accumulation_equivalent

pytest_plugins = ["pytester"]

INNER = '''
import contextlib
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from accumguard.demo.toy import TokenMLP, make_rank_batches, token_loss

K = 4


def setup():
    torch.manual_seed(0)
    model = TokenMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched, make_rank_batches(seed=0, world_size=1, micro_batches=8)[0]


def loop(model, opt, sched, data, bug=None):
    for i, batch in enumerate(data):
        token_loss(model, batch)[0].backward()
        if bug == "zero_grad_inside_window":
            opt.zero_grad()
        if bug == "scheduler_every_micro_step":
            sched.step()
        if bug == "step_every_micro_step" or (i + 1) % K == 0:
            opt.step()
            if bug != "scheduler_every_micro_step":
                sched.step()
            opt.zero_grad()


@pytest.mark.parametrize("bug", [None, "step_every_micro_step", "zero_grad_inside_window",
                                 "scheduler_every_micro_step"])
def test_loop(accumulation_guard, bug):
    model, opt, sched, data = setup()
    accumulation_guard(model, opt, accumulation_steps=K, scheduler=sched)
    loop(model, opt, sched, data, bug)


def test_swallowed_violation_still_fails(accumulation_guard):
    model, opt, sched, data = setup()
    accumulation_guard(model, opt, accumulation_steps=K, scheduler=sched)
    try:
        loop(model, opt, sched, data, "step_every_micro_step")
    except Exception:
        pass


def flag_after_forward(rank, world):
    from accumguard.runtime.guard import guard
    torch.manual_seed(0)
    ddp = DDP(TokenMLP())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = make_rank_batches(seed=0, world_size=world, micro_batches=4)[rank]
    try:
        with guard(ddp, opt, accumulation_steps=K):
            for i, batch in enumerate(data):
                s, _ = token_loss(ddp, batch)
                ddp.require_backward_grad_sync = (i + 1) % K == 0   # after forward: F11
                s.backward()
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
    return "no violation"


def test_dist_run_ddp_flag_after_forward(dist_run):
    out = dist_run(flag_after_forward, world_size=2, timeout=120)
    assert all(o.startswith("GradientSyncError: [rank") for o in out), out
    print("\\n".join(out))
'''


def test_plugin_from_entry_point_fails_broken_loops_and_passes_correct_ones(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """One subprocess run (no -p option: the fixtures can only come from the pytest11
    entry point) of a test file using both fixtures; its outcomes are the self-check."""
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.setenv("COLUMNS", "1000")  # untruncated summary lines
    run = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "-s", timeout=240)
    out = run.stdout
    out.no_fnmatch_line("*fixture 'accumulation_guard' not found*")
    out.no_fnmatch_line("*fixture 'dist_run' not found*")
    run.assert_outcomes(passed=3, failed=3, errors=1)
    out.fnmatch_lines(["PASSED test_inner.py::test_loop[[]None[]]"])
    out.fnmatch_lines(["*FAILED test_inner.py::test_loop[[]step_every_micro_step[]]*"
                       "StepInsideWindowError*[[]F1 optimizer step inside the window[]] "
                       "window 0, micro-step 0*"])
    out.fnmatch_lines(["*FAILED test_inner.py::test_loop[[]zero_grad_inside_window[]]*"
                       "ZeroGradInsideWindowError*[[]F3 *"])
    out.fnmatch_lines(["*FAILED test_inner.py::test_loop[[]scheduler_every_micro_step[]]*"
                       "SchedulerStepError*[[]F4 *"])
    # raised and swallowed by the loop: the fixture still fails the test, at teardown
    out.fnmatch_lines(["ERROR test_inner.py::test_swallowed_violation_still_fails - Failed: "
                       "accumulation guard violations*"])
    # a violation raised in the test is not reported a second time at teardown
    out.no_fnmatch_line("*ERROR test_inner.py::test_loop*")
    # dist_run ran the DDP worker on 2 gloo ranks; both saw the flag set after forward
    out.fnmatch_lines(["PASSED test_inner.py::test_dist_run_ddp_flag_after_forward"])
    out.fnmatch_lines([
        "*GradientSyncError: [[]rank 0[]] [[]F11 gradient synchronisation on the wrong "
        "micro-step[]] window 0, micro-step 0: saw require_backward_grad_sync=True at forward "
        "but False at backward*"])


# -- the equivalence helper, on the audit ------------------------------------------------------

K = 4


def _build() -> torch.nn.Module:
    torch.manual_seed(3)
    return TokenMLP()


def _sgd(params) -> torch.optim.Optimizer:  # noqa: ANN001
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def _batches(rank: int, world: int) -> list:
    return make_rank_batches(seed=5, world_size=world, micro_batches=8)[rank]


def _sched(opt: torch.optim.Optimizer):  # noqa: ANN202
    return torch.optim.lr_scheduler.LambdaLR(opt, _decay)


def _decay(step: int) -> float:
    return 1.0 / (1.0 + step)


SETUP = AuditSetup(build_model=_build, make_optimizer=_sgd, rank_batches=_batches,
                   loss_fn=token_loss, accumulation_steps=K, count_fn=count_tokens,
                   make_scheduler=_sched)


def ddp_loop(ctx: LoopContext, bug: str | None = None) -> None:
    """A hand-written DDP loop with exact token normalisation; ``bug`` injects one mistake."""
    model = DDP(ctx.model)
    opt = ctx.make_optimizer(model.parameters())
    sched = ctx.make_scheduler(opt)
    k = ctx.accumulation_steps
    for start in range(0, len(ctx.batches), k):
        window = ctx.batches[start:start + k]
        n = torch.tensor(float(sum(count_tokens(b) for b in window)))
        dist.all_reduce(n)
        for i, batch in enumerate(window):
            last = i == len(window) - 1
            if bug == "sync_flag_after_forward":
                s, _ = ctx.loss_fn(model, batch)
                model.require_backward_grad_sync = last
                (s * ctx.world_size / n).backward()
            elif bug == "step_every_micro_step":  # the seed: every micro-step is a step
                s, c = ctx.loss_fn(model, batch)
                (s / c).backward()
                opt.step()
                sched.step()
                opt.zero_grad()
                continue
            else:
                with contextlib.nullcontext() if last else model.no_sync():
                    s, _ = ctx.loss_fn(model, batch)
                    (s * ctx.world_size / n).backward()
            if bug == "zero_grad_inside_window":
                model.zero_grad()
            if bug == "scheduler_every_micro_step":
                sched.step()
        if bug != "step_every_micro_step":
            opt.step()
            if bug != "scheduler_every_micro_step":
                sched.step()
            opt.zero_grad()


BUGS = ["step_every_micro_step", "zero_grad_inside_window", "scheduler_every_micro_step",
        "sync_flag_after_forward"]


def test_equivalence_helper_passes_correct_and_fails_each_broken_loop() -> None:
    """The helper on the audit, one spawn for the correct loop and the four broken ones:
    the correct loop passes (its report is attached to the error), each broken one fails."""
    loops = {"correct": ddp_loop} | {bug: functools.partial(ddp_loop, bug=bug) for bug in BUGS}
    with pytest.raises(NotEquivalentError) as info:
        assert_accumulation_equivalent(SETUP, loops, world_size=2, steps=2, engine="ddp")
    message = str(info.value)
    print(message)
    correct = info.value.reports["correct"]
    assert correct.passed and correct.max_update_error <= 1e-5 and correct.engine == "ddp"
    assert "loop 'correct'" not in message
    for bug in BUGS:
        assert f"NOT equivalent to the large batch for loop {bug!r}" in message
        assert not info.value.reports[bug].passed
