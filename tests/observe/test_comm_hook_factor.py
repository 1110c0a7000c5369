"""A DDP communication hook of the script's decides how the ranks' gradients are combined:
the observer reads the sum of each bucket the hook is handed and the checksum the optimizer
received, and the factor the hook applied over the ranks is fitted offline (2 gloo ranks,
K micro-steps under no_sync). A hook that sums while each rank's loss is its own mean is
F10, W times the large batch (blind round 71 b_b01, missed before); a summing hook under a
loss over the ranks' global count, an averaging hook (its own or torch's) under rank
means, are silent; an averaging hook under the global count without x W is the ledger's
F10, as with DDP's own reduction. Each form's update is compared with the large batch's,
and the watched run is bit-identical to the unwatched one."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.watch._findings import analyze, load_recordings
from accumguard.watch._recording import recording

K, B, D, C, STEPS = 2, 3, 5, 4, 3
FORMS = ("sum hook rank mean", "avg hook rank mean", "torch hook rank mean",
         "sum hook global count", "avg hook global count")


def _data(world: int) -> list[list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    g = torch.Generator().manual_seed(9)
    return [[[(torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g))
              for _ in range(K)] for _ in range(world)] for _ in range(STEPS)]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, 6), torch.nn.Tanh(), torch.nn.Linear(6, C))


# (no annotations: under `from __future__ import annotations` DDP would read them as
# strings and reject the hook)
def _sum_hook(state, bucket):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _avg_hook(state, bucket):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    world = dist.get_world_size()
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def _rank(rank: int, world: int, path: str) -> dict[str, torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

    data = _data(world)
    out = {}
    for watched, form in [(True, f) for f in FORMS] + [(False, FORMS[0])]:
        sub = Path(path) / form.replace(" ", "_")
        # (as `accumguard watch` runs it: observing from before the hook is registered)
        with recording(sub) if watched else contextlib.nullcontext():
            model = DDP(_model())
            start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
            hook = {"sum": _sum_hook, "avg": _avg_hook, "torch": default_hooks.allreduce_hook}
            model.register_comm_hook(None, hook[form.split()[0]])
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            for step in range(STEPS):
                for m, (x, y) in enumerate(data[step][rank]):
                    with model.no_sync() if m < K - 1 else contextlib.nullcontext():
                        if form.endswith("rank mean"):
                            loss = F.cross_entropy(model(x), y) / K
                        else:  # over the window's rows on every rank (equal here: K*B*W)
                            loss = F.cross_entropy(model(x), y, reduction="sum") / (K * B * world)
                        loss.backward()
                opt.step()
                opt.zero_grad()
        end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out[form if watched else "unwatched"] = end - start
    return out


def _reference(world: int) -> torch.Tensor:
    data = _data(world)
    model = _model().double()
    start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        x = torch.cat([mb[0] for r in data[step] for mb in r]).double()
        y = torch.cat([mb[1] for r in data[step] for mb in r])
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, list[dict[str, torch.Tensor]]]:
    from accumguard.runtime.launch import run_on_ranks

    path = tmp_path_factory.mktemp("comm_hook")
    return path, run_on_ranks(_rank, 2, (str(path),), timeout=600)


def _errors(path: Path, form: str) -> list:
    findings, _, _ = analyze(load_recordings(path / form.replace(" ", "_")), k_flag=K)
    return [f for f in findings if f.severity == "error"]


def _update_error(update: torch.Tensor) -> float:
    ref = _reference(2)
    return float((update.double() - ref).norm() / ref.norm())


def test_the_watched_run_is_bit_identical(
        runs: tuple[Path, list[dict[str, torch.Tensor]]]) -> None:
    for updates in runs[1]:
        assert torch.equal(updates[FORMS[0]], updates["unwatched"])


@pytest.mark.parametrize("form", ["avg hook rank mean", "torch hook rank mean",
                                  "sum hook global count"])
def test_hooks_that_give_the_large_batch_are_silent(
        runs: tuple[Path, list[dict[str, torch.Tensor]]], form: str) -> None:
    path, updates = runs
    assert _update_error(updates[0][form]) < 1e-5
    assert _errors(path, form) == []


def test_a_summing_hook_under_rank_means_is_f10(
        runs: tuple[Path, list[dict[str, torch.Tensor]]]) -> None:
    path, updates = runs
    assert _update_error(updates[0]["sum hook rank mean"]) > 0.5  # about 2x the step
    errors = _errors(path, "sum hook rank mean")
    assert [f.cls for f in errors] == ["F10"], errors
    assert "hook sums the gradients over the ranks without dividing by W" in errors[0].title
    assert "2x too large" in errors[0].title


def test_an_averaging_hook_under_a_global_count_is_the_ledgers_f10(
        runs: tuple[Path, list[dict[str, torch.Tensor]]]) -> None:
    path, updates = runs
    assert _update_error(updates[0]["avg hook global count"]) > 0.3  # about half the step
    errors = _errors(path, "avg hook global count")
    assert [f.cls for f in errors] == ["F10"], errors
