"""The single-process reference every correctness claim is measured against.

One process, the full effective batch of each window (every micro-batch of
every rank), loss = Σ per-sample losses / N, **one** backward and one
optimizer step per window, in float64 by default. It deliberately shares no
code with the Accumulator (no scaling function, no engine, no micro-step
backward): a reference that runs the code under test proves nothing.

Errors are measured on the *update*, ``Δθ = θ_after − θ_initial``: relative to
the weights, a wrong update hides behind large weights.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["ReferenceRun", "reference_run", "relative_update_error", "cast_floats", "move_to",
           "flat_params", "canonical_name", "windows_for_reference"]


def cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    """``obj`` with every floating tensor (in dicts, lists, tuples) cast to ``dtype``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast_floats(v, dtype) for v in obj)
    return obj


def move_to(obj: Any, device: torch.device | str) -> Any:
    """``obj`` with every tensor (in dicts, lists, tuples) on ``device``; dtypes unchanged.
    Tensors already there are returned as they are (no copy on the CPU-only path)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: move_to(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(move_to(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device) for v in obj)
    return obj


_WRAPPERS = frozenset({"module", "_orig_mod", "_fsdp_wrapped_module"})


def canonical_name(name: str) -> str:
    """A parameter's name without the leading wrapper parts DDP, ``torch.compile`` or FSDP1
    add (``module.fc.weight`` → ``fc.weight``); inner parts that merely look alike stay."""
    parts = name.split(".")
    while len(parts) > 1 and parts[0] in _WRAPPERS:
        parts = parts[1:]
    return ".".join(parts)


def flat_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU float64 copies of the parameters, by name (wrapper prefixes stripped)."""
    out = {}
    for full_name, p in model.named_parameters():
        name = canonical_name(full_name)
        assert name not in out, f"two parameters map to {name!r} after stripping wrappers"
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[name] = t.to("cpu", torch.float64).clone()
    return out


@dataclass
class ReferenceRun:
    """Per-step record of the reference: parameters after each step, the gradient the
    optimizer received (after clipping), the LR used, and the window's loss."""

    initial: dict[str, torch.Tensor]
    params: list[dict[str, torch.Tensor]] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    lrs: list[tuple[float, ...]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)


def reference_run(
    model: torch.nn.Module,
    make_optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
    windows: Sequence[Sequence[Any]],
    loss_fn: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, Any]],
    *,
    make_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    max_grad_norm: float | None = None,
    dtype: torch.dtype = torch.float64,
    autocast: torch.dtype | None = None,
) -> ReferenceRun:
    """Step a private copy of ``model`` once per window on all of the window's micro-batches.

    ``loss_fn(model, batch)`` returns ``(sum of per-sample losses, count)``.
    ``windows[i]`` lists every micro-batch of window i, of every rank.
    ``autocast``: run the forward under ``torch.autocast(dtype=autocast)`` (weights and
    gradients stay ``dtype``): the large batch at a low compute precision, whose distance
    from the fp64 run measures what that precision alone costs on this model and data.
    """
    # On the CPU whatever device ``model`` is on: the reference is the CPU fp64 run, and
    # every comparison happens there (observed tensors arrive as CPU float64 too).
    ref = copy.deepcopy(model).to("cpu", dtype)
    params = [p for p in ref.parameters() if p.requires_grad]
    opt = make_optimizer(params)
    sched = make_scheduler(opt) if make_scheduler is not None else None
    run = ReferenceRun(initial=flat_params(ref))
    for window in windows:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=dtype)
        count = 0.0
        for batch in window:
            with (torch.autocast("cpu", dtype=autocast) if autocast is not None
                  else contextlib.nullcontext()):
                s, n = loss_fn(ref, cast_floats(move_to(batch, "cpu"), dtype))
            total = total + s.to(dtype)
            count += float(n)
        if count == 0:
            run.params.append(flat_params(ref))
            run.grads.append({})
            run.lrs.append(())
            run.losses.append(0.0)
            run.counts.append(0.0)
            continue
        (total / count).backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        run.grads.append({n: (p.grad.detach() if p.grad is not None else torch.zeros_like(p))
                          .to("cpu", torch.float64, copy=True) for n, p in ref.named_parameters()})
        run.lrs.append(tuple(float(g["lr"]) for g in opt.param_groups))
        opt.step()
        if sched is not None:
            sched.step()
        run.params.append(flat_params(ref))
        run.losses.append(float(total.detach() / count))
        run.counts.append(count)
    return run


def relative_update_error(initial: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                          reference: dict[str, torch.Tensor]) -> float:
    """``‖Δθ_target − Δθ_ref‖ / ‖Δθ_ref‖`` over all parameters, Δ relative to ``initial``."""
    num = torch.zeros((), dtype=torch.float64)
    den = torch.zeros((), dtype=torch.float64)
    for name, theta0 in initial.items():
        d_ref = reference[name].double() - theta0.double()
        d_tgt = target[name].double() - theta0.double()
        num += (d_tgt - d_ref).pow(2).sum()
        den += d_ref.pow(2).sum()
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return float((num / den).sqrt())


def windows_for_reference(rank_batches: list[list[Any]], accumulation_steps: int,
                          drop_last_window: bool = False) -> list[list[Any]]:
    """All ranks' micro-batches of each window, in the order a K-window loop consumes them."""
    n = len(rank_batches[0])
    windows = []
    for start in range(0, n, accumulation_steps):
        stop = min(start + accumulation_steps, n)
        if drop_last_window and stop - start < accumulation_steps:
            break
        windows.append([b for rank in rank_batches for b in rank[start:stop]])
    return windows


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """The reference and the diagnosis run many tiny ops: intra-op threads only contend
    (measured 40× slower on a loaded 2-core machine), so use one, then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
