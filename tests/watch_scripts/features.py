"""Correct accumulation loops written with the autograd features people use, for the
feature matrix (``tests/runtime/test_watch_features.py``).

``features.py OUT ENGINE[,ENGINE] FEATURE[,FEATURE...] [--inproc] [--child-without-torch]``
with ENGINE ``plain``
(one process), ``ddp`` or ``fsdp2`` (2 gloo ranks under torchrun; ``ddp,fsdp2`` runs both,
one after the other); a feature that does not apply to an engine (``APPLIES``) is left out. Each feature is a
short K = 2 training run (3 optimizer steps) whose final parameters (full tensors) are
saved to ``OUT/params-<engine>-<feature>-rank<R>.pt``:

* without ``--inproc`` the features run one after the other as written (the command
  ``accumguard watch`` observes, or the unobserved reference run);
* with ``--inproc`` each feature runs twice in this process: unobserved, then inside
  ``accumguard.watch._recording.recording(OUT/<engine>-<feature>)`` (the Observer in-process);
  both parameter sets are saved (``ref`` and ``obs``).

Every loop is correct: each window's loss is normalised by K, one step per K backwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint

K, STEPS, MB = 2, 3, 4
ENGINE = "plain"


# ------------------------------------------------------------------------------ helpers
def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def batch(step: int, micro: int, dim: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank() + 10 * step + micro)
    return torch.randn(MB, dim, generator=g), torch.randn(MB, 4, generator=g)


def tokens(step: int, micro: int, vocab: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank() + 10 * step + micro)
    return (torch.randint(0, vocab, (MB, 3), generator=g),
            torch.randint(0, vocab, (MB * 3,), generator=g))


class Block(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(h))


class Net(nn.Module):
    def __init__(self, ckpt: str = "", norm: bool = False) -> None:
        super().__init__()
        self.ckpt = ckpt
        self.inp = nn.Linear(8, 16)
        self.norm = nn.BatchNorm1d(16) if norm else None
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 4)
        self.extra: nn.Module | None = None  # a second head, used once extra_on is set
        self.extra_on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if self.norm is not None:
            h = self.norm(h)
        for b in self.blocks:
            if self.ckpt:
                h = checkpoint(b, h, use_reentrant=self.ckpt == "reentrant")
            else:
                h = b(h)
        if self.extra is not None and self.extra_on:
            return self.head(h) + self.extra(h)
        return self.head(h)


def second_head(net: Net, seed: int) -> tuple[nn.Module, bool]:
    """A second head first used in the middle of a window: called at the top level in one
    process; inside the model under DDP/FSDP2 (a module outside the engine would have its
    gradients synchronised by nobody: the ranks would train different heads). Returns
    the head and whether it is called at the top level."""
    torch.manual_seed(seed)
    head = nn.Linear(16, 4)
    if ENGINE == "plain":
        return head, True
    net.extra = head
    return head, False


class TokenNet(nn.Module):
    def __init__(self, vocab: int = 12, dim: int = 8, tied: bool = False,
                 sparse: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, sparse=sparse)
        self.out = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.out.weight = self.emb.weight

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(t))).reshape(-1, self.out.out_features)


def seeded(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make()


#: called with every model the engine wraps (in-process tests attach observers there)
ON_WRAP: list[Callable[[nn.Module], None]] = []


def wrap(model: nn.Module, *, units: list[nn.Module] | None = None,
         unused: bool = False) -> nn.Module:
    """The engine of this run around ``model``: DDP (``unused``: parameters may get no
    gradient, as DDP needs for freezing after construction), or FSDP2 on ``units`` and
    the root."""
    if ENGINE == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, find_unused_parameters=unused)
    elif ENGINE == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for u in units or []:
            fully_shard(u, mesh=mesh)
        fully_shard(model, mesh=mesh)
    for fn in ON_WRAP:
        fn(model)
    return model


@contextlib.contextmanager
def micro_sync(model: nn.Module, last: bool) -> Iterator[None]:
    """Gradient sync only on the window's last micro-batch (DDP no_sync, FSDP2's flag)."""
    if ENGINE == "ddp" and not last:
        with model.no_sync():  # type: ignore[operator]
            yield
        return
    if ENGINE == "fsdp2":
        model.set_requires_gradient_sync(last)  # type: ignore[operator]
    yield


def inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model) if ENGINE == "ddp" else model


def full(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in inner(model).named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach().clone()
    for name, b in inner(model).named_buffers():
        out["buffer:" + name] = b.detach().clone()
    return out


def train(model: nn.Module, opt: torch.optim.Optimizer, *,
          loss_fn: Callable[[nn.Module, int, int], torch.Tensor] | None = None,
          before: Callable[[int], None] | None = None) -> dict[str, torch.Tensor]:
    """The plain K-step loop: forward, loss / K, backward; step + zero_grad at the boundary."""
    for step in range(STEPS):
        if before is not None:
            before(step)
        for micro in range(K):
            last = micro == K - 1
            with micro_sync(model, last):
                if loss_fn is None:
                    x, y = batch(step, micro)
                    loss = F.mse_loss(model(x), y) / K
                else:
                    loss = loss_fn(model, step, micro)
                loss.backward()
        opt.step()
        opt.zero_grad()
    return full(model)


# ----------------------------------------------------------------------------- features
def f_ckpt(reentrant: bool) -> dict[str, torch.Tensor]:
    net = seeded(lambda: Net(ckpt="reentrant" if reentrant else "plain"))
    model = wrap(net, units=list(net.blocks))
    return train(model, torch.optim.AdamW(model.parameters(), lr=1e-2))


def f_compile(backend: str) -> dict[str, torch.Tensor]:
    net = seeded(Net)
    model = wrap(net, units=list(net.blocks))
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(_m: nn.Module, step: int, micro: int) -> torch.Tensor:
        x, y = batch(step, micro)
        return F.mse_loss(compiled(x), y) / K

    return train(model, opt, loss_fn=loss_fn)


def f_resize() -> dict[str, torch.Tensor]:
    """An embedding grown after the first step (new tokens), then the optimizer rebuilt
    (and the DDP wrapper, which fixes its parameters at construction)."""
    net = seeded(TokenNet)
    model = wrap(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss_fn(m: nn.Module, step: int, micro: int) -> torch.Tensor:
        t, y = tokens(step, micro, vocab=12)
        return F.cross_entropy(m(t), y) / K

    state = {"model": model, "opt": opt}
    for step in range(STEPS):
        if step == 1:
            core = inner(state["model"])
            old = core.emb
            new = nn.Embedding(old.num_embeddings + 4, old.embedding_dim)
            with torch.no_grad():
                new.weight[:old.num_embeddings] = old.weight
                new.weight[old.num_embeddings:] = 0.01
            core.emb = new
            state["model"] = wrap(core)
            state["opt"] = torch.optim.AdamW(state["model"].parameters(), lr=1e-2)
        model, opt = state["model"], state["opt"]
        for micro in range(K):
            with micro_sync(model, micro == K - 1):
                loss_fn(model, step, micro).backward()
        opt.step()
        opt.zero_grad()
    return full(state["model"])


def f_freeze() -> dict[str, torch.Tensor]:
    """The first block frozen for the second window, unfrozen for the third."""
    net = seeded(Net)
    model = wrap(net, units=list(net.blocks), unused=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def before(step: int) -> None:
        for p in net.blocks[0].parameters():
            p.requires_grad_(step != 1)

    return train(model, opt, before=before)


def f_add_group() -> dict[str, torch.Tensor]:
    """The backbone frozen for the first window, then unfrozen; a second head added with
    ``add_param_group`` at the second step and first called in the middle of that window."""
    net = seeded(Net)
    head2, top = second_head(net, 1)
    model = wrap(net, units=list(net.blocks), unused=True)
    for p in net.inp.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad and all(
        p is not q for q in head2.parameters())], lr=1e-2)

    def before(step: int) -> None:
        if step == 1:
            for p in net.inp.parameters():
                p.requires_grad_(True)
            opt.add_param_group({"params": list(net.inp.parameters()) + list(head2.parameters()),
                                 "lr": 5e-3})

    out = train(model, opt, loss_fn=_second_head_loss(net, head2, top), before=before)
    if top:  # else in the model's parameters
        out.update({"head2." + k: v.detach().clone() for k, v in head2.named_parameters()})
    return out


def _second_head_loss(net: Net, head2: nn.Module, top: bool
                      ) -> Callable[[nn.Module, int, int], torch.Tensor]:
    def loss_fn(m: nn.Module, step: int, micro: int) -> torch.Tensor:
        x, y = batch(step, micro)
        on = (step, micro) >= (1, 1)
        net.extra_on = on
        loss = F.mse_loss(m(x), y)
        if on and top:
            loss = loss + F.mse_loss(head2(x.repeat(1, 2)), y)
        return loss / K

    return loss_fn


def f_sparse() -> dict[str, torch.Tensor]:
    """``nn.Embedding(sparse=True)`` + ``SparseAdam`` (the dense output layer is frozen: one
    optimizer, one boundary)."""
    net = seeded(lambda: TokenNet(sparse=True))
    net.out.weight.requires_grad_(False)
    model = wrap(net)
    opt = torch.optim.SparseAdam([net.emb.weight], lr=1e-2)

    def loss_fn(m: nn.Module, step: int, micro: int) -> torch.Tensor:
        t, y = tokens(step, micro)
        return F.cross_entropy(m(t), y) / K

    return train(model, opt, loss_fn=loss_fn)


def f_autograd_grad() -> dict[str, torch.Tensor]:
    """Gradients from ``torch.autograd.grad``, accumulated into ``.grad`` by hand."""
    model = wrap(seeded(Net))  # one process only
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for step in range(STEPS):
        for micro in range(K):
            x, y = batch(step, micro)
            grads = torch.autograd.grad(F.mse_loss(model(x), y) / K, params)
            for p, g in zip(params, grads, strict=True):
                p.grad = g if p.grad is None else p.grad + g
        opt.step()
        opt.zero_grad()
    return full(model)


class _Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return K * MB * 2

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 * int(os.environ.get("RANK", "0")) + i)
        return torch.randn(8, generator=g), torch.randn(4, generator=g)


def f_workers() -> dict[str, torch.Tensor]:
    """A DataLoader with 2 persistent worker processes, two epochs (K micro-batches each
    window, STEPS windows; the windows cross the epoch boundary)."""
    net = seeded(Net)
    model = wrap(net, units=list(net.blocks))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(_Data(), batch_size=MB, num_workers=2,
                                         persistent_workers=True)
    micro = 0
    for _epoch in range(2):
        for x, y in loader:
            if micro >= K * STEPS:
                break
            with micro_sync(model, micro % K == K - 1):
                (F.mse_loss(model(x), y) / K).backward()
            micro += 1
            if micro % K == 0:
                opt.step()
                opt.zero_grad()
    return full(model)


#: ``--child-without-torch``: the child only prints (a Python start without torch's import):
#: for the runs where the child is not observed (the unobserved references and the
#: in-process Observer, which observes this process only), where only the parent's
#: parameters are compared. Under ``accumguard watch`` the child is the torch process
#: below, observed in its own right (its recording is not its parent rank's).
_CHILD_WITHOUT_TORCH = "print(1.0)\n"
_CHILD = ("import torch\n"
          "m = torch.nn.Linear(3, 2)\n"
          "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
          "m(torch.ones(2, 3)).sum().backward()\n"
          "o.step()\n"
          "with torch.no_grad():\n"
          "    print(float(m(torch.ones(1, 3)).sum()))\n")


def f_subprocess() -> dict[str, torch.Tensor]:
    """The script starts a Python process (that trains a step of its own) after its first
    step, on rank 0 only (as an evaluation or export job is)."""
    net = seeded(Net)
    model = wrap(net, units=list(net.blocks))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def before(step: int) -> None:
        if step == 1 and rank() == 0:
            child = _CHILD_WITHOUT_TORCH if "--child-without-torch" in sys.argv else _CHILD
            out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                 check=True, timeout=120)
            assert out.stdout.strip(), out.stderr

    return train(model, opt, before=before)


def f_tied() -> dict[str, torch.Tensor]:
    net = seeded(lambda: TokenNet(tied=True))
    model = wrap(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss_fn(m: nn.Module, step: int, micro: int) -> torch.Tensor:
        t, y = tokens(step, micro)
        return F.cross_entropy(m(t), y) / K

    return train(model, opt, loss_fn=loss_fn)


def f_buffers() -> dict[str, torch.Tensor]:
    """BatchNorm: running statistics (buffers) updated by every forward."""
    net = seeded(lambda: Net(norm=True))
    model = wrap(net, units=list(net.blocks))
    return train(model, torch.optim.AdamW(model.parameters(), lr=1e-2))


def f_midwindow() -> dict[str, torch.Tensor]:
    """A second head (in the optimizer from the start) first called in the middle of the
    second window."""
    net = seeded(Net)
    head2, top = second_head(net, 2)
    model = wrap(net, units=list(net.blocks), unused=True)
    opt = torch.optim.AdamW(list(model.parameters()) + (
        list(head2.parameters()) if top else []), lr=1e-2)
    out = train(model, opt, loss_fn=_second_head_loss(net, head2, top))
    if top:  # else in the model's parameters
        out.update({"head2." + k: v.detach().clone() for k, v in head2.named_parameters()})
    return out


def f_signals() -> dict[str, torch.Tensor]:
    """A preemption handler (as Lightning and submitit install): SIGTERM sets a flag and
    chains to the previous handler when that one is callable; the loop finishes its
    window and goes on. The process sends itself SIGTERM after the first step."""
    preempted: list[int] = []

    def on_term(signum: int, frame: Any) -> None:
        preempted.append(signum)
        if callable(previous):
            previous(signum, frame)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        net = seeded(Net)
        model = wrap(net, units=list(net.blocks))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

        def before(step: int) -> None:
            if step == 1:
                os.kill(os.getpid(), signal.SIGTERM)

        out = train(model, opt, before=before)
        assert preempted == [signal.SIGTERM], preempted
        return out
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Virtual:
    """An import hook (a ``sys.meta_path`` finder) serving one module of its own."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        import importlib.machinery

        if name != "features_virtual":
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        module.SCALE = 0.5


def f_import_hook() -> dict[str, torch.Tensor]:
    finder = _Virtual()
    sys.meta_path.insert(0, finder)
    try:
        sys.modules.pop("features_virtual", None)
        import features_virtual  # type: ignore[import-not-found]  # noqa: PLC0415
        import torch.utils.data.sampler  # noqa: F401, PLC0415 - imported through the hook chain
        net = seeded(Net)
        model = wrap(net, units=list(net.blocks))
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * features_virtual.SCALE)
        return train(model, opt)
    finally:
        sys.meta_path.remove(finder)


FEATURES: dict[str, Callable[[], dict[str, torch.Tensor]]] = {
    "ckpt": lambda: f_ckpt(False),
    "ckpt_reentrant": lambda: f_ckpt(True),
    "compile_aot_eager": lambda: f_compile("aot_eager"),
    "compile_inductor": lambda: f_compile("inductor"),
    "resize": f_resize,
    "freeze": f_freeze,
    "add_group": f_add_group,
    "sparse": f_sparse,
    "autograd_grad": f_autograd_grad,
    "workers": f_workers,
    "subprocess": f_subprocess,
    "tied": f_tied,
    "buffers": f_buffers,
    "midwindow": f_midwindow,
    "signals": f_signals,
    "import_hook": f_import_hook,
}


#: the features that apply to each engine (DDP fixes its parameters at construction and
#: reduces only through backward; FSDP2 shards parameters: no resize, no sparse gradients)
APPLIES = {
    "plain": list(FEATURES),
    "ddp": [f for f in FEATURES if f not in ("autograd_grad", "compile_inductor")],
    "fsdp2": [f for f in FEATURES if f not in ("autograd_grad", "compile_inductor", "resize",
                                               "sparse")],
}


def main() -> None:
    global ENGINE
    out, engines, names = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(",")
    inproc = "--inproc" in sys.argv
    if engines != ["plain"]:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    out.mkdir(parents=True, exist_ok=True)
    for ENGINE in engines:
        for name in names:
            if name not in APPLIES[ENGINE]:
                continue
            tag = f"{ENGINE}-{name}"
            if inproc:
                from accumguard.watch._recording import recording

                ref = FEATURES[name]()
                with recording(out / tag):
                    obs = FEATURES[name]()
                torch.save({"ref": ref, "obs": obs}, out / f"params-{tag}-rank{rank()}.pt")
            else:
                torch.save(FEATURES[name](), out / f"params-{tag}-rank{rank()}.pt")
    if engines != ["plain"]:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    print("features done", ",".join(engines), ",".join(names))


if __name__ == "__main__":
    main()
