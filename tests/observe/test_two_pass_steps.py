"""Two-pass optimizer steps (sharpness-aware minimisation, weight perturbation): the
parameters are moved in place after a first pass of backwards, the gradient is cleared,
and a second pass makes the gradient the base optimizer steps on. The clearing is the
method, not a zero_grad inside the accumulation window (F3): the observer begins the
window again there and judges the second pass; a zero_grad between two passes over
unchanged parameters stays F3. Every loop runs in this process under watch's recording."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.observe.rules import analyze
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording


def _sam(tmp: Path, *, k: int, perturb: bool, ddp: bool = False, steps: int = 3
         ) -> list[tuple[str, str, str]]:
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(),
                                                 torch.nn.Linear(16, 3))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(2 * k * steps)]
    with recording(tmp):
        if ddp:
            model = torch.nn.parallel.DistributedDataParallel(model)
        params = [p for p in model.parameters()]
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        for s in range(steps):
            window = data[s * k:(s + 1) * k]
            for x, y in window:
                (F.cross_entropy(model(x), y) / k).backward()
            with torch.no_grad():
                norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
                shifts = [p.grad * (0.05 / (norm + 1e-12)) for p in params]
                if perturb:
                    for p, e in zip(params, shifts, strict=True):
                        p.add_(e)  # the ascent step to w + e(w)
            opt.zero_grad()
            # SAM's second pass runs on the same micro-batches; without the perturbation,
            # other micro-batches (the first pass's gradient is then lost: F3)
            for x, y in window if perturb else data[(steps + s) * k:(steps + s + 1) * k]:
                (F.cross_entropy(model(x), y) / k).backward()
            if perturb:
                with torch.no_grad():
                    for p, e in zip(params, shifts, strict=True):
                        p.sub_(e)  # back to w before the base optimizer's step
            opt.step()
            opt.zero_grad()
    found, _, _ = analyze(load_recordings(tmp))
    return [(f.cls, f.severity.value, f.title) for f in found]


@pytest.mark.parametrize("k", [1, 4])
def test_sam_two_pass_step_is_a_note_not_f3(tmp_path: Path, k: int) -> None:
    found = _sam(tmp_path, k=k, perturb=True)
    assert not [f for f in found if f[1] in ("error", "warning")], found
    assert [f[0] for f in found if "two-pass step" in f[2]] == ["F3"], found


def test_a_second_pass_over_unchanged_parameters_and_other_data_is_still_f3(tmp_path: Path) -> None:
    found = _sam(tmp_path, k=4, perturb=False)
    assert ("F3", "error") in [(c, s) for c, s, _ in found], found
    assert not [f for f in found if "two-pass step" in f[2]], found


def test_sam_under_ddp_is_judged_from_its_second_pass(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from helpers import free_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        found = _sam(tmp_path, k=1, perturb=True, ddp=True)
    finally:
        dist.destroy_process_group()
    assert not [f for f in found if f[1] in ("error", "warning")], found
    assert [f[0] for f in found if "two-pass step" in f[2]] == ["F3"], found
