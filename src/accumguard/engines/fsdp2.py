"""FSDP2 (``fully_shard``): gradients are reduce-scattered into sharded DTensor grads.

Two sync modes, both exact:

* ``deferred`` (default): micro-steps 1..K-1 run with
  ``set_requires_gradient_sync(False)`` and ``set_is_last_backward(False)``, so
  each rank keeps the *unsharded* gradient and accumulates into it; the last
  micro-step reduce-scatters once. One reduce-scatter round per optimizer step,
  but unsharded-gradient memory during the window.
* ``eager``: every micro-step reduce-scatters and FSDP2 accumulates into the
  sharded gradient. K rounds per step, sharded-gradient memory only.

**Why sum, not FSDP2's average.** FSDP2 divides by the data-parallel size by
default; the adapter instead sets the gradient divide factor to 1.0 on *every*
FSDP module (the setter is per module, it does not recurse) and declares
``averages_over_ranks=False``: the loss of each micro-step is then scaled by
exactly 1/N and the reduction is a plain sum, so one factor is applied once.
Keeping the average would mean scaling the loss by W/N and letting the
collective divide by W: two roundings that cancel only when W is a power of
two, and a divisor that depends on the mesh (HSDP divides by shard × replicate
size) and on any factor the user set before. The sum needs none of that. Gloo has no
``PREMUL_SUM``, which FSDP2 uses for a custom factor, so on gloo the adapter
also sets ``set_force_sum_reduction_for_comms(True)`` (a SUM collective and a
no-op division by 1.0); on NCCL it leaves that switch alone.

Every FSDP2 setting the adapter touches is read from the FSDP state first and
restored by :meth:`FSDP2Engine.close`, per parameter group.

**Window memory** (``window_memory``). ``"sharded"`` (default) leaves FSDP2's resharding
as configured: with ``reshard_after_backward`` on (FSDP2's default) every micro-step
all-gathers the parameters again. ``"unsharded"`` trades memory for communication:
micro-steps 1..K-1 run with ``reshard_after_backward=False`` and ``reshard_after_forward``
off, so the parameters gathered by the window's first forward stay unsharded until the
last micro-step's backward reshards them (one all-gather round per window instead of K,
plus the unsharded parameters' memory for the window). The settings are restored at the
boundary and by :meth:`FSDP2Engine.close`. In that mode the micro-steps strictly between
the window's first and last run without the non-root modules' FSDP2 forward hooks, which
would only find every parameter unsharded and nothing to reduce (``skip_idle_hooks``;
bit-identical, conditions and fallback in :mod:`accumguard.engines._fsdp2_window`).

**Precision.** With ``MixedPrecisionPolicy(param_dtype=bf16)`` and no fp32
``reduce_dtype``, FSDP2 sums the window's micro-gradients (and reduces them) in bf16;
:meth:`FSDP2Engine.set_accumulation_dtype` warns (``"auto"``) or refuses (``"float32"``)
with the fix. With ``reduce_dtype=torch.float32`` the deferred mode's unsharded
gradients are upcast and summed in fp32 by FSDP2 itself.

**gloo, 2 ranks** (``pair_all_reduce``): FSDP2's reduce-scatter runs as one exchange of
halves between the two ranks, the same bits at about a fifth of gloo's reduce-scatter CPU
cost (see :class:`_PairAllReduceScatter`), and so does its all-gather (the same bytes, about
a third less CPU; :class:`_PairAllGather`).

**Counting.** The adapter wraps each parameter group's reduce-scatter comm
object (the hook FSDP2 exposes as ``set_custom_reduce_scatter``) in a counter
that delegates to the comm that was there: ``reduce_scatters`` counts calls
(one per FSDP module that reduced), :meth:`FSDP2Engine.grad_collectives` counts
*rounds*: micro-steps in which at least one reduce-scatter ran. While the
adapter is active the comm is a custom one, so FSDP2 setters that insist on its
default comm (``set_symm_mem_for_comm``, ...) must be called before creating the
adapter, or with ``count_collectives=False``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch
import torch.distributed as dist

from accumguard.core.errors import ConfigError
from accumguard.core.scaling import GradReduction
from accumguard.engines import _pair
from accumguard.engines._fsdp2_window import IdleHooks
from accumguard.engines.base import Engine, any_nonfinite

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup, Work
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

__all__ = ["FSDP2Engine", "WindowMemory"]

#: Where FSDP2 parameters live between a window's micro-steps (see the module docstring).
WindowMemory = Literal["sharded", "unsharded"]


class _CountingReduceScatter:
    """FSDP2 reduce-scatter comm that counts its calls and delegates to the previous comm."""

    def __init__(self, inner: ReduceScatter, engine: FSDP2Engine) -> None:
        self.inner = inner
        self.engine = engine

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        out: torch.Tensor = self.inner.allocate(size, dtype=dtype, device=device)
        return out

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: ProcessGroup, op: dist.ReduceOp | dist.ReduceOp.RedOpType,
                 async_op: bool = False) -> Work | None:
        self.engine.reduce_scatters += 1
        return self.inner(output_tensor, input_tensor, group, op, async_op)


class _CountingAllGather:
    """FSDP2 all-gather comm that counts its calls and delegates to the previous comm."""

    def __init__(self, inner: AllGather, engine: FSDP2Engine) -> None:
        self.inner = inner
        self.engine = engine

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        out: torch.Tensor = self.inner.allocate(size, dtype=dtype, device=device)
        return out

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: ProcessGroup, async_op: bool = False) -> Work | None:
        self.engine.all_gathers += 1
        return self.inner(output_tensor, input_tensor, group, async_op)


class _PairAllReduceScatter:
    """gloo, 2 ranks, SUM: FSDP2's reduce-scatter as one exchange of halves
    (:func:`accumguard.engines._pair.reduce_scatter_pair`): send the peer's half of the
    input, receive the peer's copy of this rank's half into the output, add this rank's own.
    (Named after its first form, an in-place all-reduce of the input and a copy of this
    rank's half.)

    Why: gloo's reduce-scatter of a tensor costs about twice the CPU time of its all-reduce
    of the same tensor, and the all-reduce about twice this exchange (25 MB, 2 ranks: 31-32,
    15-16 and 6.4-6.6 ms CPU; docs/dev/performance-journal.md). Why it is exact: with two
    ranks each element of the result is the sum of the same two numbers, ``a + b``, which
    IEEE 754 rounds identically in either order, so the output holds the same bits as
    gloo's reduce-scatter gives. Anything else (another op, an async call, a group of
    another size, an input that is not twice the output, an output inside the input's
    memory) goes to the comm that was there. The input is left as it was (FSDP2 does not
    read it after the call; it keeps it only to delay freeing it)."""

    def __init__(self, inner: ReduceScatter) -> None:
        self.inner = inner
        self.calls = 0  # reductions served by the all-reduce (the tests read it)

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        out: torch.Tensor = self.inner.allocate(size, dtype=dtype, device=device)
        return out

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: ProcessGroup, op: dist.ReduceOp | dist.ReduceOp.RedOpType,
                 async_op: bool = False) -> Work | None:
        if (async_op or not isinstance(op, dist.ReduceOp.RedOpType)
                or op != dist.ReduceOp.SUM or group.size() != 2
                or input_tensor.numel() != 2 * output_tensor.numel()
                or input_tensor.dtype != output_tensor.dtype or input_tensor.device.type != "cpu"
                or not input_tensor.is_contiguous() or not output_tensor.is_contiguous()
                or output_tensor.untyped_storage().data_ptr()
                == input_tensor.untyped_storage().data_ptr()):
            return self.inner(output_tensor, input_tensor, group, op, async_op)
        half = output_tensor.numel()
        flat = input_tensor.view(-1)
        own, other = (flat[:half], flat[half:]) if group.rank() == 0 else (flat[half:], flat[:half])
        _pair.reduce_scatter_pair(output_tensor.view(-1), own, other, group, whole=input_tensor)
        self.calls += 1
        return None



class _PairAllGather:
    """gloo, 2 ranks: FSDP2's in-place all-gather (its input is this rank's slot of the
    output) as one exchange of halves (:func:`accumguard.engines._pair.all_gather_pair`):
    the same bytes in the same places, about a third less CPU than gloo's all-gather.
    Anything else (an async call, a group of another size, another layout) goes to the comm
    that was there."""

    def __init__(self, inner: AllGather) -> None:
        self.inner = inner
        self.calls = 0  # gathers served by the exchange (the tests read it)

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        out: torch.Tensor = self.inner.allocate(size, dtype=dtype, device=device)
        return out

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: ProcessGroup, async_op: bool = False) -> Work | None:
        half = input_tensor.numel()
        if (async_op or group.size() != 2 or output_tensor.numel() != 2 * half
                or input_tensor.device.type != "cpu" or input_tensor.dtype != output_tensor.dtype
                or not input_tensor.is_contiguous() or not output_tensor.is_contiguous()
                or input_tensor.data_ptr() != output_tensor.data_ptr()
                + group.rank() * half * output_tensor.element_size()):
            return self.inner(output_tensor, input_tensor, group, async_op)
        _pair.all_gather_pair(output_tensor, input_tensor, group).wait()
        self.calls += 1
        return None

def _backend_for(device: torch.device, group: ProcessGroup | None) -> str:
    """The backend name that serves ``device`` in ``group`` (``"cpu:gloo,cuda:nccl"`` aware)."""
    backend = str(dist.get_backend(group))
    if ":" not in backend:
        return backend
    for part in backend.split(","):
        dev, _, name = part.partition(":")
        if dev == device.type:
            return name
    return backend


class FSDP2Engine(Engine):
    """Adapter for a model whose root (and submodules) went through ``fully_shard``.

    Args:
        model: the *root* FSDP2 module (the one you call forward on).
        sync: ``"deferred"`` (one reduce-scatter round per optimizer step) or
            ``"eager"`` (one per micro-step; sharded-gradient memory).
        count_collectives: wrap FSDP2's reduce-scatter and all-gather comms to count calls.
        window_memory: ``"sharded"`` (default; FSDP2's own resharding, an all-gather per
            micro-step) or ``"unsharded"`` (parameters stay unsharded for the window's
            micro-steps: one all-gather round per window, more memory); see the module doc.
        skip_idle_hooks: with ``window_memory="unsharded"`` and ``sync="deferred"``, run the
            micro-steps between the window's first and last without the non-root modules'
            FSDP2 forward hooks when they would change nothing (bit-identical; see
            :mod:`accumguard.engines._fsdp2_window`). Default True.
        pair_all_reduce: on gloo with 2 ranks, run FSDP2's reduce-scatter as one exchange
            of halves between the two ranks (the same bits; gloo's reduce-scatter costs about
            twice its all-reduce, which costs about twice the exchange), and its all-gather the
            same way. Only where FSDP2's default comms are in place. Default True. (The name
            is that of its first form, an all-reduce.)
    """

    name = "fsdp2"
    # Per-parameter-group FSDP2 settings this adapter changes, saved and restored verbatim.
    _SETTINGS = ("gradient_divide_factor", "force_sum_reduction_for_comms", "reduce_grads",
                 "all_reduce_grads", "_reduce_scatter_comm", "_all_gather_comm",
                 "reshard_after_backward", "post_forward_mesh_info")

    def __init__(self, model: torch.nn.Module, *, sync: str = "deferred",
                 count_collectives: bool = True,
                 window_memory: WindowMemory = "sharded",
                 skip_idle_hooks: bool = True, pair_all_reduce: bool = True) -> None:
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(model, FSDPModule):
            raise ConfigError(
                f"FSDP2Engine needs the root module returned by fully_shard, got "
                f"{type(model).__name__}; call fully_shard(submodule) on each block and then "
                "fully_shard(model) on the root before creating the Accumulator")
        if sync not in ("deferred", "eager"):
            raise ConfigError(f"sync ({sync!r}) must be 'deferred' (one reduce-scatter per "
                              "optimizer step) or 'eager' (one per micro-step)")
        if window_memory not in get_args(WindowMemory):
            raise ConfigError(
                f"window_memory ({window_memory!r}) must be 'sharded' (FSDP2's resharding as "
                "configured) or 'unsharded' (keep parameters unsharded for the window's "
                "micro-steps: fewer all-gathers, more memory)")
        self.sync_mode = sync
        self.window_memory = window_memory
        self._fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        self._groups = [g for m in self._fsdp_modules
                        for g in m._get_fsdp_state()._fsdp_param_groups]
        super().__init__(model, process_group=self._data_parallel_group(model))
        self.reduce_scatters = 0
        self.all_gathers = 0
        self._rounds = 0
        # (FSDP2 parameter group, its settings before): restored verbatim on close(), each
        # setting of its own type (a factor, flags, comm objects, a mesh info)
        self._saved: list[tuple[FSDPParamGroup, dict[str, Any]]] = []
        self._root: FSDPModule = model
        self._saved_is_last = model._get_fsdp_state()._state_ctx.is_last_backward
        force_sum = _backend_for(self.device, self.process_group) == "gloo"
        for g in self._groups:
            missing = [k for k in self._SETTINGS if not hasattr(g, k)]
            if missing:
                raise ConfigError(
                    f"this torch ({torch.__version__}) FSDP2 parameter group has no {missing}; "
                    "accumguard reads them to restore FSDP2's settings on close() and was "
                    "written against torch 2.13. Use a supported torch or report the version")
            self._saved.append((g, {k: getattr(g, k) for k in self._SETTINGS}))
        for m in self._fsdp_modules:
            m.set_gradient_divide_factor(1.0)
            if force_sum:
                m.set_force_sum_reduction_for_comms(True)
        self._pair_comms: list[_PairAllReduceScatter] = []
        self._pair_gathers: list[_PairAllGather] = []
        if pair_all_reduce and force_sum and self.world_size == 2:
            for g in self._groups:
                if type(g._reduce_scatter_comm).__name__ == "DefaultReduceScatter":
                    comm = _PairAllReduceScatter(g._reduce_scatter_comm)
                    g._reduce_scatter_comm = comm  # type: ignore[assignment]
                    self._pair_comms.append(comm)
                if type(g._all_gather_comm).__name__ == "DefaultAllGather":
                    gather = _PairAllGather(g._all_gather_comm)
                    g._all_gather_comm = gather  # type: ignore[assignment]
                    self._pair_gathers.append(gather)
        if count_collectives:
            for g in self._groups:
                g._reduce_scatter_comm = _CountingReduceScatter(  # type: ignore[assignment]
                    g._reduce_scatter_comm, self)
                g._all_gather_comm = _CountingAllGather(  # type: ignore[assignment]
                    g._all_gather_comm, self)
        self._counting = count_collectives
        self._position = 0  # this micro-step's index in its window
        self.idle_hooks: IdleHooks | None = None
        if window_memory == "unsharded":
            self.idle_hooks = IdleHooks(model, self._fsdp_modules)
            if not (skip_idle_hooks and sync == "deferred"):
                self.idle_hooks.disable()

    @staticmethod
    def _data_parallel_group(model: torch.nn.Module) -> ProcessGroup:
        """The process group FSDP2 reduce-scatters over (from the parameters' 1-D mesh)."""
        from torch.distributed.tensor import DTensor

        meshes = {p.device_mesh for p in model.parameters() if isinstance(p, DTensor)}
        if not meshes:
            raise ConfigError("the FSDP2 model has no sharded (DTensor) parameters; expected "
                              "fully_shard to have sharded at least one module")
        if len(meshes) > 1 or next(iter(meshes)).ndim != 1:
            raise ConfigError(
                f"FSDP2Engine supports one 1-D data-parallel mesh, got "
                f"{sorted(str(m) for m in meshes)}; HSDP and FSDP+TP meshes are not supported "
                "yet. Shard with fully_shard(module, mesh=init_device_mesh(dev, (world,)))")
        return next(iter(meshes)).get_group()

    def reduction(self) -> GradReduction:
        # Divide factor 1.0 on every FSDP module: the reduce-scatter is a plain sum.
        return GradReduction(world_size=self.world_size, averages_over_ranks=False)

    def _set_sync(self, enabled: bool) -> None:
        fsdp = self._root
        fsdp.set_requires_gradient_sync(enabled)  # recurses over every FSDP module
        fsdp.set_is_last_backward(enabled)

    @contextlib.contextmanager
    def micro_step(self, *, is_last: bool) -> Iterator[None]:
        # Set before forward, so the whole forward+backward of this micro-step sees one mode.
        # is_last_backward=False on a deferred micro-step skips FSDP2's end-of-backward
        # finalisation (waits on reductions that did not happen); the last one runs it.
        self._set_sync(is_last or self.sync_mode == "eager")
        position, self._position = self._position, 0 if is_last else self._position + 1
        idle = self.idle_hooks
        if self.window_memory == "unsharded":
            self._keep_unsharded(not is_last)
            if is_last and idle is not None:
                idle.forget_forward_order()
        before = self.reduce_scatters
        try:
            if idle is None:
                yield
            else:
                with idle.skipped_if(position > 0 and not is_last):
                    yield
        finally:
            if self.reduce_scatters > before:
                self._rounds += 1

    def _keep_unsharded(self, keep: bool) -> None:
        """Keep parameters unsharded after this micro-step's forward and backward (``keep``),
        or, on the last micro-step, reshard after backward as the user configured."""
        for g, saved in self._saved:
            g.post_forward_mesh_info = None  # no reshard after forward inside the window
            g.reshard_after_backward = False if keep else saved["reshard_after_backward"]

    def sync(self) -> None:
        if self.window_memory == "unsharded":
            for g, saved in self._saved:
                g.post_forward_mesh_info = saved["post_forward_mesh_info"]

    def abort_window(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Also reshard parameters a window left unsharded (``window_memory="unsharded"``)."""
        super().abort_window(optimizer)
        self._position = 0
        if self.window_memory == "unsharded":
            self.sync()
            for m in self._fsdp_modules:
                m.reshard()
            for g, saved in self._saved:
                g.reshard_after_backward = saved["reshard_after_backward"]

    def set_accumulation_dtype(self, mode: str) -> str:
        """Check that FSDP2 itself sums the window in fp32 (it owns the gradients): with a
        low-precision compute dtype the unsharded gradients are upcast only when
        ``reduce_dtype`` is fp32; in eager mode the sharded gradients are summed in the
        parameters' stored dtype."""
        from accumguard.engines.precision import LOW_PRECISION

        worst: torch.dtype | None = None
        for g in self._groups:
            mp = g.mp_policy
            for fp in g.fsdp_params:
                stored = fp.sharded_param.dtype
                compute = mp.param_dtype or stored
                reduce = mp.reduce_dtype or compute
                if compute in LOW_PRECISION and reduce in LOW_PRECISION:
                    worst = reduce
                elif self.sync_mode == "eager" and stored in LOW_PRECISION:
                    worst = stored
        if worst is None:
            return "float32"
        name = str(worst).removeprefix("torch.")
        if mode == "native":
            return name
        text = (f"FSDP2 would sum this window's gradients in {name} (parameters or "
                f"MixedPrecisionPolicy.param_dtype in {name} with no fp32 reduce_dtype"
                f"{', or sharded ' + name + ' gradients in eager mode' if self.sync_mode == 'eager' else ''}"
                "): the rounding error grows with K (failure class F12). Fix: fully_shard(..., "
                "mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                "reduce_dtype=torch.float32)) on every module, fp32 stored parameters, "
                "sync='deferred', or accumulation_dtype='native' to accept it")
        if mode == "float32":
            raise ConfigError(f"accumulation_dtype='float32': {text}")
        import warnings

        from accumguard.core.errors import AccumguardWarning

        warnings.warn(f"accumguard: {text}", AccumguardWarning, stacklevel=4)
        return name

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip by the global norm over all shards; return that norm as a plain tensor.

        ``clip_grad_norm_`` on DTensor gradients computes a norm that is partial
        per rank and reduced over the mesh when it scales the gradients, so the
        clip coefficient is global. ``full_tensor()`` materialises it for the caller.
        """
        norm = torch.nn.utils.clip_grad_norm_(self.parameters_with_grad(), max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return norm

    def nonfinite_grads(self, norm: torch.Tensor | None) -> torch.Tensor | None:
        """Gradients are sharded after the reduce-scatter: a NaN from one rank's micro-step
        lands only in the shard that owns it, so a rank-local check would let ranks
        disagree. With clipping the norm is already global (reused, free); without it,
        one scalar all-reduce of "this rank's shards hold a NaN/Inf" per window."""
        if norm is not None:
            return ~torch.isfinite(torch.as_tensor(norm))
        local: list[torch.Tensor] = []
        for p in self.parameters_with_grad():
            g = p.grad
            assert g is not None  # (parameters_with_grad)
            to_local = getattr(g, "to_local", None)  # a DTensor's shard
            shard = (to_local() if to_local is not None else g).detach()
            if shard.numel() > 0:
                local.append(shard)
        bad = torch.zeros((), dtype=torch.float32, device=self.device)
        if local:
            bad = any_nonfinite(local).float().to(self.device)
        if self.world_size > 1:
            dist.all_reduce(bad, group=self.process_group)
        return bad > 0

    def grad_collectives(self) -> int | None:
        """Reduce-scatter *rounds* (micro-steps that reduced), whatever the number of modules."""
        return self._rounds if self._counting else None

    def close(self) -> None:
        """Put back every setting read at construction, per parameter group."""
        for group, settings in self._saved:
            for key, value in settings.items():
                setattr(group, key, value)
        self._saved = []
        self._root.set_is_last_backward(self._saved_is_last)

    def describe(self) -> str:
        return (f"{self.name} (sync={self.sync_mode}, world={self.world_size}, sum reduction, "
                f"{len(self._fsdp_modules)} FSDP modules)")
