"""Data parallelism written by hand that reduces the accumulated ``.grad`` after every
micro-batch's backward (no DDP, 2 gloo ranks). Averaging (SUM then /W) each time is
idempotent on the part already averaged, so the window still sums every micro-batch of
every rank once and the run equals the large batch (blind round 71 b_c01, a false F10
before): silent, the scale judged from the ranks' checksums (a loss times W over the
window's global count, averaged: correct; without the x W: averaged after a division by W,
F10). A SUM without /W after every micro-batch counts the earlier micro-batches W times
again: F10, the reduction inside the window. The run's update is compared with the large
batch's too, so each form's verdict is checked against what it computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, V, B, T, STEPS = 3, 11, 2, 6, 2
FORMS = ("avg each", "avg each clipped", "avg each no xW", "sum each")


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
    for form in FORMS:
        torch.manual_seed(0)
        model = _LM()
        start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        with recording(Path(path) / form.replace(" ", "_")):
            for step in range(STEPS):
                mine = data[step][rank]
                n = torch.tensor(float(sum(int((y != -100).sum()) for _, y in mine)))
                dist.all_reduce(n)
                for x, y in mine:
                    tok = F.cross_entropy(model(x).view(-1, V), y.view(-1), reduction="sum",
                                          ignore_index=-100)
                    (tok / n if form == "avg each no xW" else tok * world / n).backward()
                    for p in model.parameters():
                        assert p.grad is not None
                        dist.all_reduce(p.grad)
                        if form != "sum each":
                            p.grad.div_(world)
                if form == "sum each":
                    for p in model.parameters():
                        assert p.grad is not None
                        p.grad.div_(world)
                if form.endswith("clipped"):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.2)
                opt.step()
                opt.zero_grad()
        end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out[form] = end - start
    return out


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
