"""fp32 gradient accumulation for low-precision (bf16/fp16) parameters.

Why: a bf16 gradient has 8 significant bits. Summing K micro-step gradients in
``p.grad`` (what autograd does) rounds the running sum to 8 bits after every
add, and the error grows with K (failure class F12; about 1e-2 to 7e-2 of the
update at K = 512 on small models). :class:`MainGrads` moves each micro-step's
gradient, as soon as autograd has finished it, into an fp32 buffer and clears
``p.grad``; the window's sum lives in fp32. At the boundary the buffer is
reduced once in fp32 (one all-reduce of one flat buffer on DDP) and written
back to ``p.grad`` in the parameter's dtype, which is one rounding whatever K
(the optimizer of a bf16 parameter can only take a bf16 gradient).

Cost: 4 bytes per low-precision parameter element (the buffer lives for the
whole run, allocated once) and one fp32 add per element per micro-step.

The *mode* (:data:`AccumulationDtype`) is chosen on the Accumulator:
``"auto"`` (fp32 accumulation when a trainable parameter is bf16/fp16, else
nothing to do), ``"float32"`` (required: engines that cannot provide it raise
ConfigError with the fix) and ``"native"`` (accumulate in the parameter's dtype,
as the engine does by itself).

**fp32 master weights** (``Accumulator(..., master_weights=True)``, :class:`MasterWeights`).
Even an exact fp32 window sum must be rounded to bf16 (2^-9 relative) when the optimizer of a
bf16 parameter reads it, and a bf16 weight cannot take an update smaller than its own ulp.
What mixed-precision training does instead (Megatron's main params, DeepSpeed's bf16
optimizer, FSDP2 with fp32 sharded parameters and ``param_dtype=bf16``): the optimizer steps
fp32 *masters* with the fp32 gradient; the bf16 parameters are a rounded copy, refreshed after
every step. Here the masters replace the low-precision parameters inside the user's own
optimizer (its ``param_groups``, before any state exists), the fp32 window sum is lent to
them as their ``.grad`` (no copy), clipping and GradScaler see that fp32 gradient, and an
optimizer step post-hook copies the masters back into the model. Cost: 4 more bytes per
low-precision element (the masters) and the optimizer state in fp32.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

import torch

from accumguard.core.errors import AccumguardWarning, ConfigError

__all__ = ["LOW_PRECISION", "AccumulationDtype", "MainGrads", "MasterWeights",
           "enable_master_weights", "load_master_state", "low_precision_params"]

log = logging.getLogger("accumguard")

#: How gradients of a window are summed; see the module docstring.
AccumulationDtype = Literal["auto", "float32", "native"]

LOW_PRECISION = (torch.bfloat16, torch.float16)


def low_precision_params(params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """Trainable parameters stored in bf16/fp16 (whose gradients autograd keeps in bf16/fp16)."""
    return [p for p in params if p.requires_grad and p.dtype in LOW_PRECISION]


class MainGrads:
    """One flat fp32 buffer holding the window's gradient sum of the low-precision parameters.

    It covers every trainable parameter handed to it (an fp32 parameter's sum in the buffer
    is the same sum autograd would form, bit for bit), so that DDP can leave every
    micro-step under ``no_sync`` and reduce the one buffer at the boundary.

    A post-accumulate-grad hook on each parameter adds the finished micro-step gradient into
    the parameter's view of the buffer (in fp32) and sets ``p.grad`` to ``None``, so autograd
    never sums micro-gradients in bf16. :meth:`flush` (at the boundary) optionally reduces the
    buffer across ranks and writes it back to ``p.grad``.
    """

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        numel = sum(p.numel() for p in params)
        device = params[0].device if params else torch.device("cpu")
        self.flat = torch.zeros(numel, dtype=torch.float32, device=device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(v))  # type: ignore[no-untyped-call]
                         for p, v in zip(params, self.views, strict=True)]
        self.pending = False  # the buffer holds gradients not yet written back
        #: Set to True to keep a copy of each window's reduced fp32 sum in ``last_sum``
        #: (benchmarks and tests measure the accumulation error before the final cast).
        self.keep_last = False
        self.last_sum: torch.Tensor | None = None
        #: Per parameter, the fp32 tensor that receives the window's sum as its ``.grad``
        #: instead of the parameter (a master weight, see :class:`MasterWeights`), or None.
        self.targets: list[torch.Tensor | None] | None = None
        # True while the buffer's views are lent to the targets as their gradients: it is
        # zeroed when the next window's first gradient arrives (or on discard), not at flush.
        self._lent = False

    def _hook(self, view: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def take(p: torch.Tensor) -> None:
            if p.grad is not None:
                if self._lent:
                    self._reclaim()
                view.add_(p.grad)  # fp32 += bf16, computed in fp32
                p.grad = None
                self.pending = True
        return take

    def _reclaim(self) -> None:
        """Take the lent views back from the targets (their step is over) and zero them."""
        for t in self.targets or ():
            if t is not None:
                t.grad = None
        self.flat.zero_()
        self._lent = False

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def flush(self, reduce: Callable[[torch.Tensor], None] | None = None) -> bool:
        """Reduce the buffer (``reduce(flat)`` in place, e.g. an all-reduce) and hand it to
        ``p.grad`` in the parameter's dtype; the buffer is zeroed for the next window.
        Returns whether ``reduce`` ran (False when no gradient arrived in this window)."""
        if self._lent and not self.pending:
            self._reclaim()  # still the last window's lent sum: nothing new arrived
        if not self.pending and reduce is None:
            return False
        if reduce is not None:
            reduce(self.flat)
        if self.keep_last:
            self.last_sum = self.flat.clone()
        targets = self.targets or [None] * len(self.params)
        for p, view, target in zip(self.params, self.views, targets, strict=True):
            if target is not None:
                target.grad = view  # the fp32 sum itself: no cast, no copy
                self._lent = True
            else:
                p.grad = view.to(p.dtype, copy=True)
        if not self._lent:
            self.flat.zero_()
        self.pending = False
        return reduce is not None

    def discard(self) -> None:
        """Drop the window's partial sum (an aborted window)."""
        self._reclaim()
        self.pending = False
        for p in self.params:
            p.grad = None

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


# -- fp32 master weights ---------------------------------------------------------------------

#: Why ``master_weights=True`` is refused on an engine, and what gives the same there.
_MASTERS_ELSEWHERE = {
    "fsdp2": (
        "FSDP2 owns its sharded parameters: keep them fp32 and let FSDP2 cast them for compute, "
        "fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
        "reduce_dtype=torch.float32)) on every module (the fp32 shards are the master "
        "weights, the window is summed and reduced in fp32), and drop master_weights=True"),
    "deepspeed": (
        "DeepSpeed owns the optimizer: with \"bf16\": {\"enabled\": true} (or fp16) its mixed-"
        "precision optimizer already steps fp32 master weights; add \"data_types\": "
        "{\"grad_accum_dtype\": \"fp32\"} so the window is summed in fp32 too, and drop "
        "master_weights=True"),
    "zero1": (
        "ZeroRedundancyOptimizer partitions the parameters it was built with across ranks "
        "and broadcasts them after each step; swapping fp32 copies into it would break its "
        "partitioning. Keep the parameters in fp32 and run the forward under "
        "torch.autocast(device_type, dtype=torch.bfloat16) (the fp32 parameters are then the "
        "master weights), or use engine='ddp' with a plain optimizer"),
}


class MasterWeights:
    """fp32 master copies of a model's bf16/fp16 parameters, stepped by the user's optimizer.

    Built by :func:`enable_master_weights`. ``masters[i]`` is the fp32 copy of
    ``params[i]`` (named ``names[i]``, wrapper prefixes such as DDP's ``module.`` removed).
    The optimizer's ``param_groups`` hold the masters in place of the parameters (the same
    list objects, so an optimizer that cached them still sees the swap); the window's fp32
    sum becomes their ``.grad``; a step post-hook rounds them back into the parameters.
    """

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 main_grads: MainGrads) -> None:
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        named = [(n, p) for n, p in module.named_parameters()
                 if p.requires_grad and p.dtype in LOW_PRECISION and id(p) in held]
        stateful = [n for n, p in named if optimizer.state.get(p)]
        if stateful:
            raise ConfigError(
                f"master_weights=True, but the {type(optimizer).__name__} already holds state "
                f"for {len(stateful)} low-precision parameters (e.g. {stateful[0]!r}): it has "
                "stepped, or a checkpoint was loaded into it; expected a fresh optimizer, "
                "since its state must belong to the fp32 master weights. Build the "
                "Accumulator right after the optimizer and load checkpoints afterwards "
                "(optimizer.load_state_dict then keeps the state in fp32; or "
                "accumguard.accumulate.checkpoint.load_checkpoint)")
        self.optimizer = optimizer
        self.main_grads = main_grads
        self.names = [n for n, _ in named]
        self.params: list[torch.Tensor] = [p for _, p in named]
        with torch.no_grad():  # bf16/fp16 -> fp32 is exact: the masters start equal
            self.masters = [torch.nn.Parameter(p.detach().to(torch.float32, copy=True))
                            for p in self.params]
        self._master_of = {id(p): m for p, m in zip(self.params, self.masters, strict=True)}
        self._param_of = {id(m): p for p, m in zip(self.params, self.masters, strict=True)}
        self._swap(dict(self._master_of))
        main_grads.targets = [self._master_of.get(id(p)) for p in main_grads.params]
        self._hook = optimizer.register_step_post_hook(lambda *_: self.copy_to_model())

    def _swap(self, mapping: Mapping[int, torch.Tensor]) -> None:
        for group in self.optimizer.param_groups:
            params = group["params"]
            for i, p in enumerate(params):
                params[i] = mapping.get(id(p), p)

    @property
    def nbytes(self) -> int:
        return sum(m.numel() * m.element_size() for m in self.masters)

    def stepped(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """What the optimizer steps for each of ``params``: its master, or itself."""
        return [self._master_of.get(id(p), p) for p in params]

    def parameter_of(self, t: torch.Tensor) -> torch.Tensor:
        """The model parameter a tensor of the optimizer's ``param_groups`` stands for (its
        master's parameter, or ``t`` itself): for observers that name what an optimizer
        steps by the model's parameters."""
        return self._param_of.get(id(t), t)

    def parameters_with_grad(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors whose gradients the optimizer reads (for clipping and the non-finite
        check: the fp32 gradients of the masters, not the model's empty ``.grad``)."""
        return [t for t in self.stepped(params) if t.grad is not None]

    def copy_to_model(self) -> None:
        """Round the masters into the model's parameters (after each optimizer step)."""
        if self.params:
            with torch.no_grad():
                torch._foreach_copy_(self.params, [m.data for m in self.masters])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The masters by parameter name (references, as ``Module.state_dict``)."""
        return {n: m.detach() for n, m in zip(self.names, self.masters, strict=True)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore masters saved by :meth:`state_dict`, then round them into the model."""
        if not isinstance(state, dict) or set(state) != set(self.names):
            seen = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ConfigError(
                f"the saved master weights are for parameters {seen}, but this model's "
                f"low-precision parameters are {sorted(self.names)}; expected the same model. "
                "Resume with the model the checkpoint was written from")
        for name, master in zip(self.names, self.masters, strict=True):
            saved = state[name]
            if tuple(saved.shape) != tuple(master.shape):
                raise ConfigError(
                    f"saved master weight {name!r} has shape {tuple(saved.shape)}, the model's "
                    f"parameter {tuple(master.shape)}; resume with the same model")
            with torch.no_grad():
                master.copy_(saved)
        self.copy_to_model()

    def module(self, model: torch.nn.Module) -> torch.nn.Module:
        """A module holding what the optimizer steps under ``model``'s parameter names (the
        masters for low-precision parameters, the parameters themselves otherwise): torch
        distributed checkpoint maps optimizer state to names through such a module."""
        root = torch.nn.Module()
        for name, p in model.named_parameters():
            *path, leaf = name.split(".")
            node = root
            for part in path:
                if not hasattr(node, part):
                    node.add_module(part, torch.nn.Module())
                node = getattr(node, part)
            node.register_parameter(leaf, self._master_of.get(id(p), p))
        return root

    def close(self) -> None:
        """Give the optimizer its parameters back (its state cast to their dtype, as
        ``Optimizer.load_state_dict`` does) after a last copy into the model."""
        self._hook.remove()
        self.copy_to_model()
        self.main_grads._reclaim()
        self.main_grads.targets = None
        state = self.optimizer.state
        for p, m in zip(self.params, self.masters, strict=True):
            if m in state:
                state[p] = {k: (v.to(p.dtype) if torch.is_tensor(v) and v.is_floating_point()
                                and k != "step" else v) for k, v in state.pop(m).items()}
        self._swap(self._param_of)


class MasterHost(Protocol):
    """What :func:`enable_master_weights` needs of an engine adapter (an
    :class:`~accumguard.engines.base.Engine`, which imports this module)."""

    name: str
    model: torch.nn.Module
    main_grads: MainGrads | None
    master_weights: MasterWeights | None


def enable_master_weights(engine: MasterHost, optimizer: torch.optim.Optimizer | None
                          ) -> MasterWeights | None:
    """``Accumulator(..., master_weights=True)``: fp32 masters for the engine's low-precision
    parameters, or ``None`` when every trainable parameter is already fp32 (nothing to do).
    Local and DDP only; the other engines get a ConfigError naming their own equivalent."""
    name = getattr(engine, "name", type(engine).__name__)
    if name not in ("local", "ddp"):
        fix = _MASTERS_ELSEWHERE.get(
            name, "this engine adapter does not implement fp32 master weights; keep fp32 "
                  "parameters and a bf16 autocast forward, and drop master_weights=True")
        raise ConfigError(f"master_weights=True was passed with the {name} engine, which "
                          f"accumguard does not give fp32 master weights. {fix}")
    model = engine.model
    low = low_precision_params(model.parameters())
    if not low:
        log.info("accumguard: master_weights=True: every trainable parameter is fp32 already "
                 "(it is its own master weight); nothing to do")
        return None
    if engine.main_grads is None or optimizer is None:
        raise ConfigError(
            "master_weights=True needs the window's gradient summed in fp32 (the masters' "
            "gradient), but accumulation_dtype='native' sums it in "
            f"{str(low[0].dtype).removeprefix('torch.')}; use accumulation_dtype='auto' "
            "(default) or 'float32'")
    module = getattr(model, "module", model)  # DDP: names without the "module." prefix
    masters = MasterWeights(module, optimizer, engine.main_grads)
    engine.master_weights = masters
    log.info("accumguard: fp32 master weights for %d low-precision parameters (%d bytes)",
             len(masters.params), masters.nbytes)
    return masters


def load_master_state(masters: MasterWeights | None, saved: Any) -> None:
    """Restore the masters from an Accumulator state (its ``"master_weights"`` entry)."""
    if masters is None:
        if saved:
            raise ConfigError(
                "the checkpoint holds fp32 master weights, but this Accumulator keeps none "
                "(built without master_weights=True, or with fp32 parameters); loading it "
                "would drop their fp32 precision. Build the Accumulator with "
                "master_weights=True and the low-precision model the checkpoint came from")
        return
    if saved is None:
        warnings.warn(
            "accumguard: the checkpoint holds no fp32 master weights (written without "
            "master_weights=True); the masters restart from the low-precision parameters, so "
            "the resumed run is not bitwise the uninterrupted one", AccumguardWarning,
            stacklevel=3)
        masters.load_state_dict({n: p.detach().float() for n, p in
                                 zip(masters.names, masters.params, strict=True)})
        return
    masters.load_state_dict(saved)
