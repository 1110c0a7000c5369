"""F12: where the window's gradient was really summed, in which dtype, and what that costs at
the run's K (pure Python, no torch: :mod:`.rules` runs it and re-exports its names).

Four places a gradient can be summed in bf16/fp16 over the K backwards of a window, each
read from the step record (:mod:`._precision` records the facts):

* the ``.grad`` of bf16/fp16 parameters a torch optimizer steps (a model cast to bf16, no
  fp32 buffer): the parameter dtype, and conservation showing the K contributions summed in
  place (nothing removed between backwards);
* the bf16 model's ``.grad`` behind fp32 master weights, copied to the masters only at the
  boundary (``precision.model_grad``): the optimizer steps fp32, the sum was made in bf16;
* FSDP2's unsharded gradient between micro-steps with sync off, in ``reduce_dtype``
  (``param_dtype`` when unset): ``MixedPrecisionPolicy(param_dtype=bf16)`` without an fp32
  ``reduce_dtype`` (``precision.fsdp.deferred`` and the window's sync flags);
* DeepSpeed's ``gradient_accumulation_dtype`` (``data_types.grad_accum_dtype``, default the
  ``bf16``/``fp16`` model dtype): ``precision.deepspeed.accum``.

The size: each of the K-1 additions rounds to the dtype's unit roundoff u, an expected
relative drift of u*sqrt(K)/3 (:func:`f12_drift`; measured on an MLP's bf16 micro-gradients,
K = 4..512, within 15 % of it: 2.6e-3 at K = 4, 1.8e-2 at K = 256, 2.6e-2 at K = 512). A
correct loop at that compute precision (bf16 micro-gradients summed in fp32) sits about u
from the exact gradient (measured 3.7e-3 at every K); the large batch sums once, in fp32, so
the low-precision sum is another update by construction (:mod:`accumguard.core.precision`).
F12 is an error when the sum was seen reaching the optimizer and its expected drift is a
measurable share of the update's error (K >= 4, :func:`f12_error_k`), a warning when it was
not seen reaching it. The drift is also measured where the sum is kept in a parameter's
``.grad`` (a bf16 model's own, FSDP2's unsharded gradient: :class:`._precision.AccumDrift`
shadows a sample of it in fp32): the low-precision sum against the fp32 sum of the same
micro-gradients, i.e. what the sum's dtype alone added to the update's error. A measurement
replaces the expectation: an error when, in every window measured at the longest sum, it is
at least F12_MEASURED_FACTOR times the 2u bound (half the drift expected at K = 4: the
margin of a sample of a few hundred elements), a warning otherwise (a sum that did not
round: gradients too small or too sparse to move). Autocast with fp32 parameters, fp32
master gradients summed per micro-step, FSDP2 ``reduce_dtype=float32``, DeepSpeed
``grad_accum_dtype: fp32`` and accumguard's Accumulator stay silent (a note says the
low-precision compute was seen and the sum is fp32).
"""

from __future__ import annotations

import math
from typing import Any

from accumguard.core.precision import F12_ERROR_FACTOR, f12_drift, f12_error_k
from accumguard.observe._records import Finding, RunRecording, StepWindow, _mk, lines_by_step

__all__ = ["F12_ERROR_FACTOR", "F12_MEASURED_FACTOR", "F12_MIN_K", "f12_drift", "f12_error_k", "low_precision_findings", "pair_master_sums"]

#: Unit roundoff of the low-precision gradient dtypes (as verify.tolerance, which observe
#: may not import).
_U_LOW = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
#: F12 is an error when the drift *measured* on the sum (not expected from K) is this share
#: of the 2u bound of a correct loop: u/3, half the drift expected at K = 4 (the margin of a
#: sampled measurement); less is a sum that barely rounded (a warning).
F12_MEASURED_FACTOR = 1.0 / 6.0
#: Windows shorter than this are not reported (the drift is below the precision floor).
F12_MIN_K = 4
#: Relative tolerance of a bf16/fp16 conservation verdict (as WEIGHT_TOL_LOW_PRECISION).
_TOL_LOW = 3e-2

_FIX_TORCH = ("sum the window in fp32: keep fp32 parameters and run the forward under "
              "torch.autocast(device_type, dtype=torch.bfloat16) (gradients are then fp32), "
              "or use accumguard's Accumulator (fp32 accumulation of bf16/fp16 parameters, "
              "master_weights=True), or an fp32 gradient buffer that each micro-step's .grad "
              "is added into right after its backward")
_FIX_MASTER = ("add each micro-step's bf16 .grad into the fp32 master's .grad right after its "
               "backward and clear the bf16 .grad (the window is then summed in fp32), or use "
               "accumguard's Accumulator(master_weights=True)")
_FIX_FSDP = ("fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
             "reduce_dtype=torch.float32)) on every module: FSDP2 then keeps the unsharded "
             "gradient in fp32 between micro-steps with sync off and reduces in fp32")
_FIX_FSDP_SYNC = ("synchronise once per window: model.set_requires_gradient_sync(False) for "
                  "micro-steps 1..K-1 and True for the last, so FSDP2 sums the window in its "
                  "unsharded gradient (in reduce_dtype: keep it float32) and writes the "
                  "sharded .grad once; or keep the sharded parameters in fp32 "
                  "(MixedPrecisionPolicy(param_dtype=torch.bfloat16) for the compute)")
_FIX_DS = ('add "data_types": {"grad_accum_dtype": "fp32"} to the DeepSpeed config (ZeRO-1 '
           "then runs its BF16 optimizer with fp32 gradients; ZeRO-2/3 keep fp32 gradient "
           "partitions)")


_LARGE_BATCH = ("The large batch sums its gradient once in fp32 (so does a correct loop at "
                "bf16/fp16 compute): every update here carries this rounding on top of its own")


def _deferred_run(w: StepWindow) -> int:
    """FSDP2: the most backwards summed into one unsharded gradient: a run of micro-steps
    with sync off and the synced one that closes it (0 when a flag is unknown)."""
    flags = list(w.sync_micros or [])
    if not flags or any(f is None for f in flags):
        return 0
    carried = max(0, w.window - len(flags))  # folded no-op steps
    best, run = 0, carried
    for f in flags:
        run += 1
        if f:
            best, run = max(best, run), 0
    return best


def _torch_in_place(w: StepWindow) -> bool:
    """Conservation saw the window's backwards summed in place in the stepped .grad."""
    cons = w.conservation
    if cons is None or int(w.zero_grads_between):
        return False  # unchecked: a hand-written clear or an fp32 buffer cannot be excluded
    # gradients moved out between backwards, or never seen in .grad at all (an fp32 buffer
    # filled by a post-accumulate hook): not summed in place
    return float(cons.wiped) <= 0.0 and float(cons.received) <= _TOL_LOW


def _site(w: StepWindow) -> tuple[str, int, str, str, bool] | None:
    """(dtype, backwards summed in it, where, fix, seen reaching the optimizer) of one
    window, or None when its sum is not a low-precision one."""
    prec = _prec(w)
    n = int(w.window)
    ds = prec.get("deepspeed") if isinstance(prec.get("deepspeed"), dict) else None
    if w.source == "deepspeed":
        dt = str((ds or {}).get("accum") or "")
        if dt in _U_LOW:
            return (dt, n, f"DeepSpeed's gradient accumulation buffer ({ds.get('optimizer')}, "
                    f"gradient_accumulation_dtype {dt})" if ds else "", _FIX_DS, True)
        return None
    fsdp = prec.get("fsdp") if isinstance(prec.get("fsdp"), dict) else None
    if fsdp and str(fsdp.get("deferred")) in _U_LOW:
        m = _deferred_run(w)
        if m >= 2:
            dt = str(fsdp["deferred"])
            return (dt, m, f"FSDP2's unsharded gradient between micro-steps with sync off "
                    f"(MixedPrecisionPolicy param_dtype {fsdp.get('compute')}, reduce_dtype "
                    f"{dt})", _FIX_FSDP, True)
    master = prec.get("model_grad") if isinstance(prec.get("model_grad"), dict) else None
    if master and master.get("in_place") and master.get("reached") is not False \
            and str(master.get("dtype")) in _U_LOW:
        dt = str(master["dtype"])
        seen = master.get("reached") is True
        return (dt, int(master.get("sums", n)), f"the model's {dt} .grad, copied to the "
                f"{w.param_dtype or 'fp32'} parameters the optimizer steps (master "
                "weights) only at the boundary"
                + ("" if seen else " (the optimizer's gradients could not be paired with the "
                   "model's to confirm the copy)"), _FIX_MASTER, seen)
    dt = str(w.param_dtype or "").replace("torch.", "")
    if dt in _U_LOW and w.source == "torch" and _torch_in_place(w):
        if w.engine == "fsdp2":
            # FSDP2 writes the sharded .grad only at a synced micro-step (its reduce-scatter);
            # between them the sum is its unsharded gradient's, judged above: the low-precision
            # additions here are one per sync
            flags = list(w.sync_micros or [])
            if not flags or any(f is None for f in flags):
                return None
            n = sum(1 for f in flags if f)
            if n < 2:
                return None
            return (dt, n, f"{dt} sharded .grad of the parameters the optimizer steps, one "
                    f"addition per synchronised micro-step ({n} of {w.window})", _FIX_FSDP_SYNC,
                    True)
        return dt, n, f"{dt} .grad of the parameters the optimizer steps", _FIX_TORCH, True
    return None


def _prec(w: StepWindow) -> dict[str, Any]:
    p = w.precision
    return p if isinstance(p, dict) else {}


def _fp32_note(rank: int | None, windows: list[StepWindow]) -> list[Finding]:
    """The correct twin, said once: bf16/fp16 compute seen, the window summed in fp32 by the
    engine's setting (FSDP2 reduce_dtype, DeepSpeed grad_accum_dtype)."""
    for w in windows:
        prec = _prec(w)
        if int(w.window) < 2 or str(prec.get("compute")) not in _U_LOW:
            continue
        fsdp, ds = prec.get("fsdp"), prec.get("deepspeed")
        if isinstance(ds, dict) and w.source == "deepspeed" \
                and ds.get("accum") in ("float32", "float64"):
            where = f"DeepSpeed's gradient_accumulation_dtype {ds['accum']}"
        elif isinstance(fsdp, dict) and fsdp.get("deferred") in ("float32", "float64"):
            where = f"FSDP2's reduce_dtype {fsdp['deferred']}"
        else:
            continue
        return [_mk("F12", "note", rank, w.step, None,
                    f"{prec['compute']} compute seen; the window's gradient is summed in "
                    f"{where}: no low-precision accumulation", title_="gradient accumulation "
                    "dtype: fp32 (bf16/fp16 compute)", fix="nothing to change")]
    return []


def low_precision_findings(rank: int | None, windows: list[StepWindow]
                           ) -> list[Finding]:
    """F12 over one rank's windows (module docstring): the longest low-precision sum seen,
    an error from :func:`f12_error_k` backwards when the sum was seen reaching the
    optimizer, else a warning; a note for the fp32 twin of an FSDP2/DeepSpeed setting."""
    judged = []
    for w in windows:
        site = _site(w)
        if site is not None and site[1] >= F12_MIN_K:
            judged.append((w, site))
    if not judged:
        return _returned_rounded(rank, windows) or _fp32_note(rank, windows)
    w, (dtype, n, where, fix, seen) = max(judged, key=lambda t: t[1][1])
    u = _U_LOW[dtype]
    drift, floor = f12_drift(u, n), 2 * u
    measured = _measured(judged, dtype)
    if measured is not None:
        m, d, elements, count = measured
        error = seen and d >= F12_MEASURED_FACTOR * floor
        return [_mk("F12", "error" if error else "warning", rank, w.step, None,
                    f"{n} backward passes summed in {where} ({len(judged)} window(s)); "
                    f"measured on {elements} sampled gradient elements in {count} window(s): "
                    f"the {dtype} sum of {m} micro-step gradients differs from their fp32 sum "
                    f"by {d:.2g} (relative, the smallest of those windows, {d / u:.2g} u; about "
                    f"u*sqrt(K)/3 = {f12_drift(u, m):.2g} expected, growing as sqrt(K))"
                    + (f". {_LARGE_BATCH}" if error else
                       f": below u/3 = {u / 3:.2g}, the sum barely rounded (a warning)" if seen
                       else " (not confirmed to reach the optimizer: a warning)"), fix=fix)]
    k_err = f12_error_k()
    error = seen and n >= k_err  # (the K form of drift >= F12_ERROR_FACTOR * floor: no rounding)
    return [_mk("F12", "error" if error else "warning", rank, w.step, None,
                f"{n} backward passes summed in {where} ({len(judged)} window(s)): each "
                f"addition rounds to the {dtype} unit roundoff u = {u:.3g}, an expected drift "
                f"of about u*sqrt(K)/3 = {drift:.2g} (relative) from the exact sum of the "
                "micro-step gradients, growing as sqrt(K)"
                + (f". {_LARGE_BATCH}" if error else
                   f" (an error from K >= {k_err})" if seen else
                   " (not confirmed to reach the optimizer: a warning)"), fix=fix)]


def _returned_rounded(rank: int | None, windows: list[StepWindow]) -> list[Finding]:
    """A warning for windows whose gradient left ``.grad`` between the backwards and came
    back at the step (conservation's "returned") differing from the exact sum of the
    contributions by more than the parameters' dtype rounds: a buffer of the loop's own,
    summed at a lower precision (its dtype is not seen: a warning)."""
    back = [w for w in windows if w.conservation is not None
            and w.conservation.reason == "returned" and int(w.window) >= 2
            and not any(0 < int(c) < int(w.window) for c in w.clip_micros)]
    # (a clip between the window's backwards rescaled the sum: F8's, not a rounding)
    if not back:
        return []
    worst = max(back, key=lambda w: float(w.conservation.received) if w.conservation else 0.0)
    d = float(worst.conservation.received) if worst.conservation else 0.0
    return [_mk("F12", "warning", rank, worst.step, None,
                f"in {len(back)} window(s) the gradient left .grad after each backward pass "
                f"and came back at the optimizer step differing from the exact sum of the "
                f"{worst.window} micro-step gradients by {d:.2g} (relative, gradient "
                "checksums; at most, in the window of this step): the sum was made outside "
                ".grad at a lower precision than the parameters' (a bf16 buffer rounds at "
                f"u = {_U_LOW['bfloat16']:.3g}, fp16 at {_U_LOW['float16']:.2g}); its dtype "
                "was not seen", title_="the window's gradient summed outside .grad and "
                "returned rounded: a low-precision accumulation buffer?",
                fix="keep the buffer the micro-step gradients are added into in fp32 "
                    "(torch.zeros_like(p, dtype=torch.float32)), or let them add up in "
                    "the fp32 .grad")]


def _measured(judged: list[tuple[StepWindow, tuple[str, int, str, str, bool]]], dtype: str
              ) -> tuple[int, float, int, int] | None:
    """The drift measured on the judged windows' sums (:class:`._precision.AccumDrift`):
    ``(sums, drift, elements, windows)`` at the longest sum measured, the smallest drift of
    those windows; None when no window has a usable measurement (of at least F12_MIN_K sums
    in ``dtype``; a window with a zero_grad or a clip between its backwards, or whose
    conservation saw its gradient changed, changed ``.grad`` behind the shadow's back)."""
    rows = []
    for w, _ in judged:
        d = _prec(w).get("drift")
        cons = w.conservation
        if (not isinstance(d, dict) or d.get("dtype") != dtype or int(w.zero_grads_between)
                or any(int(c) < int(w.backwards) for c in w.clip_micros or [])
                or (cons is not None and not cons.ok)):
            continue
        sums, drift = int(d.get("sums", 0)), float(d.get("drift", math.nan))
        if sums >= F12_MIN_K and math.isfinite(drift):
            rows.append((sums, drift, int(d.get("elements", 0))))
    if not rows:
        return None
    m = max(r[0] for r in rows)
    top = [r for r in rows if r[0] == m]
    return m, min(r[1] for r in top), max(r[2] for r in top), len(top)


def pair_master_sums(rec: RunRecording) -> int:
    """The master-weight pattern's copy confirmed across the ranks: where no rank could pair
    the optimizer's gradient with its own bf16 sum (a hand all-reduce of the masters'
    gradients in between), the ranks' sums added up and the optimizer's gradient (the same
    on every rank) are compared at fixed projections (:func:`._precision.model_grad_sum`);
    proportional within the low-precision tolerance, with one positive scale, the sum is
    what the optimizer stepped: ``reached`` is set on every rank's record. How many steps
    were paired."""
    def unpaired(line: dict[str, Any]) -> dict[str, Any] | None:
        prec = line.get("precision")
        master = prec.get("model_grad") if isinstance(prec, dict) else None
        ok = isinstance(master, dict) and master.get("reached") is None \
            and master.get("in_place") and master.get("proj") and master.get("recv")
        return master if ok else None

    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    by_step: dict[int, dict[int, dict[str, Any]]] = lines_by_step(rec, unpaired)
    paired = 0
    for rows in by_step.values():
        if len(rows) != len(ranks):
            continue
        sums = [sum(float(m["proj"][k]) for m in rows.values()) for k in range(len(rows[ranks[0]]["proj"]))]
        recvs = [[float(x) for x in m["recv"]] for m in rows.values()]
        a = recvs[0]
        if len(a) != len(sums) or any(len(v) != len(a) for v in recvs):
            continue
        scale_a = max(sum(abs(x) for x in a), 1e-30)
        if any(sum(abs(x - y) for x, y in zip(v, a, strict=True)) > _TOL_LOW * scale_a for v in recvs):
            continue  # the ranks' optimizers do not hold one gradient: not a shared copy
        denom = sum(x * x for x in sums)
        c = sum(x * y for x, y in zip(a, sums, strict=True)) / denom if denom > 0 else 0.0
        resid = sum(abs(x - c * y) for x, y in zip(a, sums, strict=True)) / max(
            scale_a, abs(c) * sum(abs(y) for y in sums), 1e-30)
        if c > 0 and resid <= _TOL_LOW:
            for m in rows.values():
                m["reached"], m["scale"] = True, c
            paired += 1
    return paired
