"""Many accumulation loops on 2 real gloo ranks in ONE torchrun launch, each recorded by
the observation layer in its own directory (``accumguard.watch._recording.recording``).

``torchrun --nproc-per-node 2 sweep_dist.py OUT_DIR [NAME ...]``
(``sweep_dist.py run NAME``: one scenario, not recorded, for ``accumguard watch``). Each scenario is a
3-step (K = 4) training of a small MLP written the way users write it: DDP, FSDP2
(``fully_shard`` + ``set_requires_gradient_sync``), torch ``ZeroRedundancyOptimizer``
over DDP, Accelerate's ``accumulate()``. The name says what it is: ``*_ok`` correct,
``*_wasteful`` correct but syncing every micro-step, otherwise the failure class the
loop has. The test analyses each directory as ``accumguard watch -k 4`` would.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard.watch._recording import recording

K, STEPS, MB = 4, 3, 4


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def data(n: int = K * STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    return [(torch.randn(MB, 8, generator=g), torch.randint(0, 4, (MB,), generator=g))
            for _ in range(n)]


# Names are looked up at call time: the recording() of each scenario patches torch's
# clipping after this module was imported (under `accumguard watch` the bootstrap patches
# first, so `from torch.nn.utils import clip_grad_norm_` is seen as well).
def ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(out, y) / K


# ----------------------------------------------------------------------------- DDP
def ddp(bug: str) -> None:
    model = DDP(mlp())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for i, (x, y) in enumerate(data(K * STEPS + (1 if bug == "F13" else 0))):
        last = (i + 1) % (K + 1 if bug == "F13" else K) == 0
        if bug == "F3":
            model.zero_grad()
        if bug == "F11":  # flag set after the forward: DDP already decided
            out = model(x)
            model.require_backward_grad_sync = last
            ce(out, y).backward()
        elif bug == "never":  # no_sync on every micro-step, the last one too
            with model.no_sync():
                ce(model(x), y).backward()
        elif bug == "wasteful":  # no_sync around the backward only: still reduces
            loss = ce(model(x), y)
            with contextlib.nullcontext() if last else model.no_sync():
                loss.backward()
        else:
            with contextlib.nullcontext() if last else model.no_sync():
                ce(model(x), y).backward()
        if bug == "F8":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if bug == "F4":
            sched.step()
        if last:
            if bug != "F8":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            if bug != "F4":
                sched.step()
            if bug != "F7":
                opt.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- FSDP2
def fsdp2(bug: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    # explicit: FSDP2's default mesh is CUDA whenever CUDA is visible, even under gloo
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opts = [torch.optim.SGD(model.parameters(), lr=0.1)]
    if bug == "two_optimizers":  # a body and a head optimizer, stepped one after the other
        opts = [torch.optim.AdamW(model[0].parameters(), lr=1e-2),
                torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9)]
    for i, (x, y) in enumerate(data()):
        last = (i + 1) % K == 0
        sync = {"ok": last, "two_optimizers": last, "inverted": not last, "never": False, "wasteful": True,
                "stepevery": last, "stepevery_never": False}[bug]
        model.set_requires_gradient_sync(sync)
        ce(model(x), y).backward()
        # stepevery*: step() + zero_grad() after every micro-batch; FSDP2 hands .grad = None
        # to the unsynced ones (no-ops), so with the flag on at the last it is the large batch
        if last or bug.startswith("stepevery"):
            for opt in opts:
                opt.step()
            for opt in opts:
                opt.zero_grad()


# ----------------------------------------------------------------------------- ZeRO-1
def zero1(bug: str) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(mlp())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
    for i, (x, y) in enumerate(data()):
        last = (i + 1) % K == 0
        with contextlib.nullcontext() if last else model.no_sync():
            ce(model(x), y).backward()
        if bug == "F1" or last:
            opt.step()
            opt.zero_grad()


# ----------------------------------------------------------------------------- Accelerate
def accelerate(bug: str) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)  # a fresh Accelerator per loop
    GradientState._reset_state()
    acc = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    for x, y in data():
        with acc.accumulate(model):
            if bug == "F3":
                model.zero_grad()  # inside the window: only the last micro-batch survives
            loss = torch.nn.functional.cross_entropy(model(x), y)
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()


SCENARIOS: dict[str, Callable[[], None]] = {
    **{f"ddp_{b}": (lambda b=b: ddp(b)) for b in
       ("ok", "wasteful", "F3", "F4", "F7", "F8", "F11", "F13", "never")},
    **{f"fsdp2_{b}": (lambda b=b: fsdp2(b)) for b in ("ok", "inverted", "never", "wasteful",
                                                          "stepevery", "stepevery_never",
                                                          "two_optimizers")},
    "zero1_ok": lambda: zero1("ok"),
    "zero1_F1": lambda: zero1("F1"),
    "accelerate_ok": lambda: accelerate("ok"),
    "accelerate_F3": lambda: accelerate("F3"),
}


def main() -> None:
    if sys.argv[1] == "run":  # one scenario, unrecorded: for `accumguard watch -- ...`
        dist.init_process_group("gloo")
        try:
            SCENARIOS[sys.argv[2]]()
        finally:
            dist.barrier()
            dist.destroy_process_group()
        return
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(SCENARIOS)
    dist.init_process_group("gloo")
    try:
        for name in names:
            with recording(out / name):
                SCENARIOS[name]()
            dist.barrier()
    finally:
        dist.barrier()
        dist.destroy_process_group()
    if os.environ.get("RANK") == "0":
        print("swept", len(names))


if __name__ == "__main__":
    main()
