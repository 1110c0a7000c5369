"""Where a window's gradient is really summed, and in which dtype (the facts F12 needs).

The optimizer's own parameter dtype (``StepEvent.param_dtype``) says where the gradient is
summed only for a plain loop: the optimizer steps the parameters whose ``.grad`` the K
backwards added into. Three common set-ups sum elsewhere:

* **fp32 master weights behind a bf16 model**: the backwards add into the bf16 model's
  ``.grad``; the loop copies that sum to fp32 copies at the boundary and steps those. The
  optimizer sees fp32, the sum was made in bf16. Seen from the checksums the observer already
  takes of the roots' parameters: the low-precision rows the optimizer does not step, summed
  in place (nothing removed between backwards), and the optimizer's gradient at the step
  equal to that sum up to one scale (:func:`model_grad_sum`).
* **FSDP2** ``MixedPrecisionPolicy``: between micro-steps with gradient sync off, FSDP2 keeps
  the unsharded gradient in ``reduce_dtype`` (``param_dtype`` when ``reduce_dtype`` is unset
  or equal); a synced micro-step's reduced shard is added to the sharded gradient in the
  stored parameter dtype (:func:`fsdp_dtypes`).
* **DeepSpeed**: the engine sums micro-gradients in its ``gradient_accumulation_dtype``
  (``data_types.grad_accum_dtype``, default: the model dtype of ``bf16``/``fp16``)
  (:func:`deepspeed_dtypes`).

The compute dtype (bf16 parameters, FSDP2 ``param_dtype``, DeepSpeed's model dtype, an
autocast region around a root forward) is recorded too: ``accumguard invariance`` derives its
tolerance from it. Everything here is read once per owner, or per checked window from
checksums already taken; nothing touches the user's tensors.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from accumguard.observe._checksum import checksums

if TYPE_CHECKING:
    from accumguard.observe._seams import DeepSpeedEngine

__all__ = ["LOW", "AccumDrift", "autocast_dtype", "deepspeed_dtypes", "fsdp_dtypes", "least_precise",
           "model_grad_sum", "name_of", "step_facts"]

LOW = (torch.bfloat16, torch.float16)
#: Relative tolerance of a bf16/fp16 checksum comparison (as ``tol_for`` of a low dtype).
_TOL_LOW = 3e-2
_ORDER = ("float16", "bfloat16", "float32", "float64")


def name_of(dtype: object) -> str | None:
    """``torch.bfloat16`` -> ``"bfloat16"`` (None for None)."""
    return None if dtype is None else str(dtype).replace("torch.", "")


def least_precise(names: Iterable[str | None]) -> str | None:
    """The least precise of the dtype names given (fp16 < bf16 < fp32 < fp64)."""
    seen = {n for n in names if n}
    for n in _ORDER:
        if n in seen:
            return n
    return next(iter(seen), None)


def autocast_dtype() -> str | None:
    """The autocast dtype in force right now (CUDA first, then CPU), None when off."""
    for device in ("cuda", "cpu"):
        with contextlib.suppress(Exception):
            if torch.is_autocast_enabled(device):
                return name_of(torch.get_autocast_dtype(device))
    return None


def fsdp_dtypes(groups: Sequence[object]) -> dict[str, str] | None:
    """FSDP2's dtypes over the parameter groups (the least precise of each): ``compute`` (the
    unsharded parameters, ``param_dtype``), ``deferred`` (the unsharded gradient summed over
    micro-steps with sync off: ``reduce_dtype``, else ``param_dtype``), ``reduce`` (the
    reduce-scatter) and ``synced`` (the sharded gradient a synced micro-step adds into: the
    stored dtype). None before FSDP2 set them (its lazy init, at the first forward)."""
    compute, deferred, synced = [], [], []
    for pg in groups:
        for fp in getattr(pg, "fsdp_params", None) or []:
            orig = getattr(fp, "orig_dtype", None)
            if orig is None or not getattr(fp.sharded_param, "requires_grad", False):
                continue
            param = getattr(fp, "param_dtype", None) or orig
            compute.append(name_of(param))
            deferred.append(name_of(getattr(fp, "reduce_dtype", None) or param))
            synced.append(name_of(orig))
    if not compute:
        return None
    out = {"compute": least_precise(compute), "deferred": least_precise(deferred),
           "synced": least_precise(synced)}
    return {k: v for k, v in out.items() if v is not None}


def deepspeed_dtypes(engine: DeepSpeedEngine) -> dict[str, str] | None:
    """DeepSpeed's model dtype and the dtype its optimizer sums micro-gradients in: the ZeRO
    optimizer's ``gradient_accumulation_dtype``, BF16_Optimizer's ``grad_acc_dtype``, else
    the engine's ``get_data_types()`` (``data_types.grad_accum_dtype``, default the model
    dtype)."""
    with contextlib.suppress(Exception):
        model, accum = engine.get_data_types()
        opt = getattr(engine, "optimizer", None)
        for attr in ("gradient_accumulation_dtype", "grad_acc_dtype"):
            value = getattr(opt, attr, None)
            if isinstance(value, torch.dtype):
                accum = value
                break
        out = {"compute": name_of(model), "accum": name_of(accum),
               "optimizer": type(opt).__name__ if opt is not None else "none"}
        return {k: v for k, v in out.items() if v is not None}
    return None


class MasterSum(TypedDict, total=False):
    """The master-weight pattern's sum on one checked window (:func:`model_grad_sum`)."""

    dtype: str | None  # the low-precision model parameters' dtype
    sums: int  # backwards summed into their .grad
    in_place: bool  # nothing removed between the backwards, nothing left from before
    reached: bool | None  # the optimizer's gradient is that sum up to one scale (None: unknown)
    scale: float  # that scale, when it was measured
    proj: list[float]  # the sum's fixed projections, when it did not pair on this rank alone
    recv: list[float]  # the optimizer's gradient's, at the same projections


@torch.no_grad()
def model_grad_sum(tracked: Sequence[torch.Tensor], members: Sequence[bool],
                   starts: Sequence[torch.Tensor], ends: Sequence[torch.Tensor],
                   opt_params: Sequence[torch.Tensor]) -> MasterSum | None:
    """The master-weight pattern on one checked window (an optimizer over fp32 parameters
    only): the roots' bf16/fp16 parameters the stepping optimizer does not hold (``members`` False), their ``.grad`` summed in place by
    the window's backwards (nothing removed between them, nothing left from before), and
    whether the optimizer's gradient at the step is that sum up to one scale (``reached``:
    None when the two parameter lists do not pair up by shape, so it cannot be told).

    ``starts``/``ends``: the window's checksums before/after each backward over ``tracked``
    (``[P, 3]``, rows positional; later rows may be missing from earlier checksums)."""
    if len(starts) < 2 or len(starts) != len(ends):
        return None
    if any(p.dtype in LOW for p in opt_params):
        return None  # the optimizer steps low-precision parameters itself: not masters
    n = min(int(c.shape[0]) for c in (*starts, *ends))
    rows = [i for i in range(min(n, len(members)))
            if not members[i] and tracked[i].dtype in LOW and tracked[i].numel() > 0]
    if not rows:
        return None
    idx = torch.tensor(rows)
    s = [c[idx] for c in starts]
    e = [c[idx] for c in ends]
    contrib = sum((b - a for a, b in zip(s, e, strict=True)), torch.zeros_like(s[0]))
    mass = float(contrib[:, 2].abs().sum())
    if mass <= 0:
        return None  # the backwards left nothing in .grad (moved to a buffer by a hook)
    # every column, the absolute sum too: a gradient's signed sums cancel to a few percent
    # of its absolute sum, so a .grad cleared between backwards (moved to an fp32 buffer)
    # hid under the tolerance when only they were compared
    gaps = sum(float((e[i - 1] - s[i]).abs().sum()) for i in range(1, len(s)))
    stale = float(s[0].abs().sum())
    in_place = gaps <= _TOL_LOW * mass and stale <= _TOL_LOW * mass
    out: MasterSum = {"dtype": least_precise(name_of(tracked[i].dtype) for i in rows),
                      "sums": len(s), "in_place": in_place, "reached": None}
    low = [tracked[i] for i in rows]
    if in_place and len(opt_params) == len(low) and all(
            tuple(p.shape) == tuple(q.shape) for p, q in zip(opt_params, low, strict=True)):
        received = checksums(opt_params)
        a = received[:, :2].reshape(-1)
        b = contrib[:, :2].reshape(-1)
        denom = float(b @ b)
        c = float(a @ b) / denom if denom > 0 else 0.0
        resid = (float((a - c * b).abs().sum())
                 / max(float(a.abs().sum()), abs(c) * float(b.abs().sum()), 1e-30))
        out["reached"] = bool(c > 0 and resid <= _TOL_LOW)
        out["scale"] = c
        if not out["reached"]:
            # after a hand all-reduce the masters hold the ranks' sums together: kept, in
            # a few fixed projections, for the pairing across ranks (pair_master_sums)
            out["proj"] = _project(b)
            out["recv"] = _project(a)
    return out


#: Fixed projections of a window's per-parameter sums: a few numbers per rank that the
#: ranks' sums can be paired by (a sum of vectors projects to the sum of projections).
_PROJECTIONS = 4


def _project(v: torch.Tensor) -> list[float]:
    idx = torch.arange(v.numel(), dtype=torch.float64)
    return [float(v @ torch.cos(idx * (0.7 + 0.61 * k) + 0.3 * k)) for k in range(_PROJECTIONS)]


def step_facts(*, params: str | None, fsdp: dict[str, str] | None,
               deepspeed: dict[str, str] | None, autocast: str | None,
               model_grad: MasterSum | None, drift: dict[str, Any] | None = None
               ) -> dict[str, Any] | None:
    """The step record's ``precision`` field: the compute dtype (the least precise of the
    roots' trainable parameters, FSDP2's ``param_dtype``, DeepSpeed's model dtype and an
    autocast region) and, when set, the FSDP2/DeepSpeed dtypes and the master-weight
    pattern's sum, and the drift :class:`AccumDrift` measured. None when nothing is
    bf16/fp16 (the record stays as it was)."""
    compute = least_precise([params, autocast, (fsdp or {}).get("compute"),
                             (deepspeed or {}).get("compute")])
    low = {"bfloat16", "float16"}
    lows = {compute, *(fsdp or {}).values(), (deepspeed or {}).get("accum")}
    if not (lows & low) and model_grad is None:
        return None
    out: dict[str, Any] = {"compute": compute}
    if autocast:
        out["autocast"] = autocast
    if fsdp:
        out["fsdp"] = fsdp
    if deepspeed:
        out["deepspeed"] = deepspeed
    if model_grad is not None:
        out["model_grad"] = model_grad
    if drift is not None:
        out["drift"] = drift
    return out


#: Elements of each watched gradient whose low-precision sum is shadowed in fp32, and how
#: many parameters are watched (the largest low-precision ones).
_DRIFT_SAMPLE = 2048
_DRIFT_PARAMS = 2
#: Windows shadowed: the first ``_DRIFT_ALWAYS``, then at doubling gaps (2, 4, 8, ... windows
#: after the last, at most ``_DRIFT_MAX_GAP``) while the shadow has cost at most
#: ``_DRIFT_BUDGET`` of the time since the first window (its hooks, taken off in the other
#: windows, cost nothing there). The drift of a sum is a property of its dtype and its K,
#: the same in every window: a few windows measure it.
_DRIFT_ALWAYS = 2
_DRIFT_MAX_GAP = 64
_DRIFT_BUDGET = 0.0025


class _Shadow:
    """One watched parameter: its sample's indices, the fp32 shadow of the sum its ``.grad``
    should hold, the contributions in it, and the last comparison (kept as tensors, read
    at the step: nothing is read to the host at a backward)."""

    __slots__ = ("count", "idx", "last", "param", "shadow")

    def __init__(self, param: torch.Tensor) -> None:
        self.param = param
        step = max(1, param.numel() // _DRIFT_SAMPLE)
        self.idx = torch.arange(0, param.numel(), step, device=param.device)[:_DRIFT_SAMPLE]
        self.shadow: torch.Tensor | None = None
        self.count = 0
        # sums, the kept sum's sample (fp32), the shadow then, its dtype
        self.last: tuple[int, torch.Tensor, torch.Tensor, str] | None = None


class AccumDrift:
    """The rounding of a window's low-precision gradient sum, measured (F12's evidence).

    A gradient hook on a few low-precision leaf parameters (a bf16 model's own, FSDP2's
    unsharded parameters) sees each backward's contribution before it is added into
    ``.grad``; a strided sample of it is summed in fp32 (the shadow: what an fp32 buffer
    would hold). Before each addition the sample of ``.grad`` (the sum actually kept, in its
    dtype) is kept beside the shadow; at the step the last pair is compared: the relative
    difference is the drift the low-precision sum added, on the same micro-gradients. Only
    there: after the window's last backward a collective may have changed ``.grad`` (DDP's
    average), so the last addition of a window is not measured (K-1 of its K sums are). A
    ``.grad`` that was moved away between backwards (FSDP2 ``reduce_dtype=float32``, an fp32
    buffer) restarts the shadow at every backward: nothing is summed there, nothing is
    measured. Sampled windows only (``_DRIFT_ALWAYS``, doubling gaps, ``_DRIFT_BUDGET``):
    in the others the hooks are off. The hooks return None (the gradient is untouched) and
    run behind the fail-safe door."""

    def __init__(self, hook: Any) -> None:
        self._hook = hook  # Failsafe.hook: the door of every torch hook
        self.shadows: dict[int, _Shadow] = {}  # (the observer reads it: any watched?)
        self._handles: list[Any] = []
        #: the candidates last read (the observer's tracked parameters' and FSDP2 roots'
        #: counts): the observer calls :meth:`watch` only when its own differ
        self.key: object = None
        self.on = True  # this window is shadowed (the hooks are on)
        self.window = 0  # windows ended since the first shadow was made
        self.spent = 0.0  # seconds the shadow has cost
        self._t0: float | None = None  # when the first shadow was made
        self._due = _DRIFT_ALWAYS  # the next window shadowed after the first ones
        self._gap = 2

    def watch(self, key: object, candidates: Iterable[torch.Tensor]) -> None:
        """Hook the largest low-precision leaf parameters among ``candidates`` (``key``:
        kept as :attr:`key`; None: look again next time)."""
        self.key = key
        if len(self.shadows) >= _DRIFT_PARAMS:
            return
        low = sorted((p for p in candidates if p.dtype in LOW and p.is_leaf and p.requires_grad
                      and p.numel() >= 2 and id(p) not in self.shadows),
                     key=lambda p: -p.numel())
        for p in low[:_DRIFT_PARAMS - len(self.shadows)]:
            if self._t0 is None:
                self._t0 = time.perf_counter()
            sh = _Shadow(p)
            self.shadows[id(p)] = sh
            if self.on:
                self._handles.append(self._register(sh))

    def _register(self, sh: _Shadow) -> Any:
        return sh.param.register_hook(self._hook(  # type: ignore[no-untyped-call]
            lambda grad, sh=sh: self._on_grad(sh, grad), "precision_drift"))

    @torch.no_grad()
    def _on_grad(self, sh: _Shadow, grad: torch.Tensor) -> None:
        if type(grad) is not torch.Tensor or grad.is_sparse:
            return
        t = time.perf_counter()
        cur = sh.param.grad
        if cur is None or sh.shadow is None or type(cur) is not torch.Tensor:
            sh.shadow = (torch.zeros(sh.idx.numel(), dtype=torch.float32, device=grad.device)
                         if cur is None or type(cur) is not torch.Tensor
                         else cur.reshape(-1)[sh.idx].float())
            sh.count = 0
        elif sh.count >= 2 and cur.dtype in LOW:
            # the kept sum's sample beside the shadow (compared at the step); the shadow
            # then grows out of place, so the one kept here stays as it is
            sh.last = (sh.count, cur.reshape(-1)[sh.idx].float(), sh.shadow,
                       str(name_of(cur.dtype)))
        sh.shadow = sh.shadow + grad.reshape(-1)[sh.idx].float()
        sh.count += 1
        self.spent += time.perf_counter() - t

    def take(self) -> dict[str, Any] | None:
        """At the step: the window's measured drift ``{"dtype", "sums", "drift",
        "elements"}`` (the longest sum measured, over the watched parameters), None when no
        low-precision sum of two or more contributions was seen; then a new window."""
        t = time.perf_counter()
        try:
            return self._take()
        finally:
            self.spent += time.perf_counter() - t

    @torch.no_grad()
    def _take(self) -> dict[str, Any] | None:
        lasts = [sh.last for sh in self.shadows.values() if sh.last is not None]
        self.reset()
        if not lasts:
            return None
        m = max(x[0] for x in lasts)
        top = [x for x in lasts if x[0] == m]
        ref = sum(float(x[2].pow(2).sum()) for x in top)
        if ref <= 0:
            return None
        err = sum(float((x[1] - x[2]).pow(2).sum()) for x in top)
        return {"dtype": top[0][3], "sums": m, "drift": (err / ref) ** 0.5,
                "elements": sum(int(sh.idx.numel()) for sh in self.shadows.values()
                                if sh.param.dtype in LOW)}

    def reset(self) -> None:
        """A new window: every shadow starts again from the ``.grad`` it will find."""
        for sh in self.shadows.values():
            sh.shadow, sh.count, sh.last = None, 0, None

    def next_window(self) -> None:
        """A window ended: reset the shadows and decide whether the next one is shadowed
        (hooks put on or taken off accordingly)."""
        self.reset()
        self.window += 1
        on = self.window < _DRIFT_ALWAYS
        if not on and self.window >= self._due:
            t0 = self._t0 if self._t0 is not None else time.perf_counter()
            on = self.spent <= _DRIFT_BUDGET * (time.perf_counter() - t0)
            if on:
                self._due = self.window + self._gap
                self._gap = min(2 * self._gap, _DRIFT_MAX_GAP)
        if on and not self.on:
            self._handles = [self._register(sh) for sh in self.shadows.values()]
        elif self.on and not on:
            for h in self._handles:
                h.remove()
            self._handles = []
        self.on = on

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self.shadows, self.key = [], {}, None
