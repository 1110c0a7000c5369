"""Data parallelism written by hand that reduces the accumulated ``.grad`` after every
micro-batch's backward (no DDP, 2 gloo ranks). Averaging (SUM then /W) each time is
idempotent on the part already averaged, so the window still sums every micro-batch of
every rank once and the run equals the large batch (blind round 71 b_c01, a false F10
before): silent, the scale judged from the ranks' checksums (a loss times W over the
window's global count, averaged: correct; without the x W: averaged after a division by W,
F10). A SUM without /W after every micro-batch counts the earlier micro-batches W times
again: F10, the reduction inside the window. The run's update is compared with the large
batch's too, so each form's verdict is checked against what it computes.

The same reductions run inside the backward, from a post-accumulate-grad hook on every
parameter (blind round 98 c_b03): a SUM of the accumulated ``.grad`` at every micro-step
and one /W at the step is F10 (the running total summed over the ranks again); the hook
averaging each time, the hook reducing only in the last micro-step's backward, and a tensor
hook reducing each micro-step's own gradient (then /W at the step) are the large batch and
silent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, V, B, T, STEPS = 3, 11, 2, 6, 2
FORMS = ("avg each", "avg each clipped", "avg each no xW", "sum each")
HOOKED = ("hook sum each", "hook avg each", "hook last only", "tensor hook")


class _LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, 8)
        self.head = torch.nn.Linear(8, V)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(x)))


def _data(world: int) -> list[list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """[step][rank][micro] batches with uneven valid-token counts."""
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(STEPS):
        per_rank = []
        for _ in range(world):
            mbs = []
            for _ in range(K):
                x = torch.randint(0, V, (B, T), generator=g)
                y = torch.randint(0, V, (B, T), generator=g)
                y[torch.rand(B, T, generator=g) < 0.4] = -100
                mbs.append((x, y))
            per_rank.append(mbs)
        out.append(per_rank)
    return out


def _rank(rank: int, world: int, path: str) -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    data = _data(world)
    out = {}
    for form in (*FORMS, *HOOKED, "faulted"):
        faulted = form == "faulted"
        form = "hook sum each" if faulted else form
        torch.manual_seed(0)
        model = _LM()
        start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        last = [False]
        handles = _hooks(form, model, world, last)
        if faulted:
            _break_the_ledgers_read()
        with recording(Path(path) / ("faulted" if faulted else form.replace(" ", "_"))) as obs:
            for step in range(STEPS):
                mine = data[step][rank]
                n = torch.tensor(float(sum(int((y != -100).sum()) for _, y in mine)))
                dist.all_reduce(n)
                for i, (x, y) in enumerate(mine):
                    last[0] = i == len(mine) - 1
                    tok = F.cross_entropy(model(x).view(-1, V), y.view(-1), reduction="sum",
                                          ignore_index=-100)
                    (tok / n if form == "avg each no xW" else tok * world / n).backward()
                    for p in model.parameters() if form in FORMS else ():
                        assert p.grad is not None
                        dist.all_reduce(p.grad)
                        if form != "sum each":
                            p.grad.div_(world)
                if form in ("sum each", "hook sum each", "hook last only", "tensor hook"):
                    for p in model.parameters():
                        assert p.grad is not None
                        p.grad.div_(world)
                if form.endswith("clipped"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.2)
                opt.step()
                opt.zero_grad()
        for h in handles:
            h.remove()
        end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out["faulted" if faulted else form] = end - start
        if faulted:
            failure = obs.failure
            out["fault reported"] = torch.tensor(
                failure is not None and "injected" in failure.error + failure.traceback)
    return out


def _break_the_ledgers_read() -> None:
    """The fault: the ledger's read of which ``.grad`` an all-reduce inside a backward
    summed raises (this rank's process is the test's own: nothing to restore)."""
    from accumguard.observe._comm_ledger import CommLedger

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected: the read of the tensor an all_reduce summed")

    CommLedger._note_sum = broken  # type: ignore[method-assign]


def _hooks(form: str, model: torch.nn.Module, world: int, last: list[bool]) -> list:
    """The hooks of the forms that reduce inside the backward (none for the others)."""
    import torch.distributed as dist

    def accumulated(p: torch.Tensor) -> None:
        if form == "hook last only" and not last[0]:
            return
        assert p.grad is not None
        dist.all_reduce(p.grad)
        if form == "hook avg each":
            p.grad.div_(world)

    def own(g: torch.Tensor) -> torch.Tensor:
        g = g.clone()
        dist.all_reduce(g)
        return g

    if form == "tensor hook":
        return [p.register_hook(own) for p in model.parameters()]
    if form in HOOKED:
        return [p.register_post_accumulate_grad_hook(accumulated) for p in model.parameters()]
    return []


def _reference(form: str, world: int) -> torch.Tensor:
    data = _data(world)
    torch.manual_seed(0)
    model = _LM().double()
    start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        x = torch.cat([mb[0] for r in data[step] for mb in r])
        y = torch.cat([mb[1] for r in data[step] for mb in r]).view(-1)
        F.cross_entropy(model(x).view(-1, V), y, ignore_index=-100).backward()
        if form.endswith("clipped"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.2)
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    from accumguard.runtime.launch import run_on_ranks

    path = tmp_path_factory.mktemp("reduced_each")
    updates = run_on_ranks(_rank, 2, (str(path),), timeout=600)
    return path, updates[0]


def _errors(path: Path, form: str) -> list:
    findings, _, _ = analyze(load_recordings(path / form.replace(" ", "_")), k_flag=K)
    return [f for f in findings if f.severity == "error"]


def _update_error(updates: dict[str, torch.Tensor], form: str) -> float:
    ref = _reference(form, 2)
    return float((updates[form].double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("form", ["avg each", "avg each clipped"])
def test_averaging_after_every_micro_batch_is_the_large_batch_and_silent(
        runs: tuple[Path, dict[str, torch.Tensor]], form: str) -> None:
    path, updates = runs
    assert _update_error(updates, form) < 1e-5
    assert _errors(path, form) == []


def test_averaging_each_micro_batch_after_a_loss_divided_by_w_is_f10(
        runs: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, updates = runs
    assert _update_error(updates, "avg each no xW") > 0.1
    errors = _errors(path, "avg each no xW")
    assert [f.cls for f in errors] == ["F10"], errors
    assert "2x too small" in errors[0].evidence, errors[0].evidence


def test_summing_after_every_micro_batch_is_f10_inside_the_window(
        runs: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, updates = runs
    assert _update_error(updates, "sum each") > 0.1
    errors = _errors(path, "sum each")
    assert "F10" in {f.cls for f in errors}, errors
    assert any("inside the window" in f.title for f in errors), errors


def test_a_hook_summing_the_accumulated_gradient_every_micro_step_is_f10(
        runs: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, updates = runs
    assert _update_error(updates, "hook sum each") > 0.1
    errors = _errors(path, "hook sum each")
    assert sorted((f.cls, f.rank) for f in errors) == [("F10", 0), ("F10", 1)], errors
    assert all("summed over the ranks again" in f.title for f in errors), errors
    assert all("micro-step(s) 2, 3 of 3" in f.evidence for f in errors), errors


@pytest.mark.parametrize("form", ["hook avg each", "hook last only", "tensor hook"])
def test_hooks_reducing_inside_the_backward_correctly_are_silent(
        runs: tuple[Path, dict[str, torch.Tensor]], form: str) -> None:
    path, updates = runs
    assert _update_error(updates, form) < 1e-5
    assert _errors(path, form) == []


def test_a_fault_reading_what_an_all_reduce_summed_changes_nothing(
        runs: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """The ledger's read of the tensor a hand all-reduce inside a backward summed (code in
    the user's process): a fault in it switches observation off, is reported as
    accumguard's, and the trained parameters are bit-equal to the run without the fault."""
    _, updates = runs
    assert bool(updates["fault reported"])
    assert torch.equal(updates["faulted"], updates["hook sum each"])
