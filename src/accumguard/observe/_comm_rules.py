"""The collective ledger against its closed form: gradient reductions the window did not need.

A correct deferred window reduces the gradient once: DDP all-reduces each of its buckets at
the window's last backward, FSDP2 reduce-scatters each group there, a hand-written loop
all-reduces after the last backward. The ledger (:mod:`._comm_ledger`, the step record's
``comm``) says what each micro-step really issued; reductions of a gradient's size inside
or between the backwards before the last are extra work. The update is the same (the sum
of the micro-steps' gradients is reduced either way), so this is a **warning**, never an
error: it states the extra collectives and bytes per optimizer step, their measured share
of the step's time where Python saw them, and the one-line change for the engine.

DeepSpeed is not judged here: ZeRO-2 reduces its gradient partitions inside every backward
by design (that is how it keeps one partition per rank); ``accumguard advise`` measures its
settings instead. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from accumguard.observe._collectives import (
    DDP_BUCKET_OP,
    DS_REDUCE_OPS,
    OWN_REDUCE_OPS,
    TORCH_REDUCE_OPS,
)
from accumguard.observe._records import Finding, JsonObject, _mk

__all__ = ["GRAD_OPS", "WindowComm", "coalesced_flush_findings", "collectives_before",
           "comm_findings", "resummed_findings", "window_comm"]

#: Ledger ops that reduce a gradient (DDP's C++ buckets, and the Python reductions).
GRAD_OPS = frozenset((DDP_BUCKET_OP, *TORCH_REDUCE_OPS, *DS_REDUCE_OPS, *OWN_REDUCE_OPS))

#: A reduction between or inside non-final backwards counts as a gradient sync when it
#: moves at least this share of the final round's bytes (a token count or a metric
#: all-reduced per micro-step is a few bytes, not a gradient).
GRADIENT_SIZED = 0.5
#: A hand-written loop's extra round must match its final round's bytes within this share.
SAME_SIZE = 0.1

_FIX = {
    "ddp": "Run the forward AND the backward of micro-steps 1..K-1 inside "
           "`with model.no_sync():` (DDP decides at the forward whether the backward "
           "all-reduces).",
    "fsdp2": "Call model.set_requires_gradient_sync(False) before micro-steps 1..K-1 and "
             "model.set_requires_gradient_sync(True) before the last one.",
}
_FIX_OTHER = ("All-reduce the accumulated gradient once, after the window's last backward, "
              "instead of after every micro-step.")


def _judged_op(engine: str, op: str) -> bool:
    """The ops that carry the engine's gradient sync: DDP's bucket all-reduces, FSDP2's
    reduce-scatters; for a hand-written loop every reduction. (Other collectives of a DDP
    or FSDP2 run, e.g. a tensor-parallel all-reduce of activation gradients inside the
    backward, are not the gradient sync and are never counted as an extra one.)"""
    if engine == "ddp":
        return op == DDP_BUCKET_OP
    if engine == "fsdp2":
        return op.startswith("reduce_scatter")
    return op in GRAD_OPS


@dataclass(frozen=True)
class WindowComm:
    """One window's gradient collectives from the ledger: the final round (``final_calls``
    calls, ``final_bytes`` bytes) and the extra rounds at the micro-steps before the last
    (``extra_micros``, 0-based), their calls, bytes and measured seconds (None: not timed);
    the window's wall time, its backwards, and whether DDP ran with ``static_graph``."""

    final_calls: int
    final_bytes: int
    extra_micros: list[int]
    extra_calls: int
    extra_bytes: int
    extra_s: float | None
    window_s: float | None
    backwards: int
    static_graph: bool


def window_comm(w: JsonObject) -> WindowComm | None:
    """One window's gradient collectives split into the final round and the extra ones
    (micro-steps before the last); None when the window has no ledger or < 2 backwards."""
    comm = w.get("comm")
    n = int(w.get("backwards", 0))
    engine = str(w.get("engine") or "local")
    if not isinstance(comm, dict) or n < 2:
        return None
    final_calls = final_bytes = 0
    early: dict[int, list[float]] = {}  # micro -> [calls, bytes, seconds measured]
    timed = False
    for op, micro, in_bw, calls, nbytes, secs in comm.get("rows", []):
        if not _judged_op(engine, op):
            continue
        micro = int(micro)
        if (in_bw and micro == n - 1) or (not in_bw and micro >= n):
            final_calls += int(calls)
            final_bytes += int(nbytes)
        elif in_bw or micro >= 1:  # inside, or right after, a backward before the last
            row = early.setdefault(micro, [0, 0, 0.0])
            row[0] += int(calls)
            row[1] += int(nbytes)
            if secs is not None:
                row[2] += float(secs)
                timed = True
    if final_bytes <= 0:
        return None  # nothing reduced at the end: the sync rules (F11, NO_UPDATE) judge it
    # an engine's sync is the whole gradient again; a hand-written one, the final round's
    # size again (a count or a metric all-reduced per micro-step is not a gradient)
    low = GRADIENT_SIZED if engine in ("ddp", "fsdp2") else 1 - SAME_SIZE
    extra = {m: r for m, r in early.items()
             if low * final_bytes <= r[1] <= (1 + SAME_SIZE) * final_bytes}
    return WindowComm(final_calls=final_calls, final_bytes=final_bytes,
                      extra_micros=sorted(extra),
                      extra_calls=int(sum(r[0] for r in extra.values())),
                      extra_bytes=int(sum(r[1] for r in extra.values())),
                      extra_s=sum(r[2] for r in extra.values()) if timed else None,
                      window_s=comm.get("window_s"), backwards=n,
                      static_graph=bool(comm.get("ddp_static_graph")))


def _size(nbytes: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= div:
            return f"{nbytes / div:.3g} {unit}"
    return f"{int(nbytes)} B"


_SAME_GRADIENT = "The optimizer receives the same gradient: communication cost only, not an error"
# a hand-written reduction: what was reduced (and with which op) is not recorded
_UNREAD = ("What each call reduced is not recorded: reducing each micro-step's own gradient, "
           "or averaging (AVG) the accumulated one, gives the optimizer the same gradient "
           "(communication cost only); a SUM of the accumulated .grad on every micro-step "
           "would count the earlier micro-batches again (W^(K-i) times; `accumguard lint` "
           "reports that shape, AG154)")


def comm_findings(rank: int, windows: list[JsonObject],
                  found: list[Finding]) -> list[Finding]:
    """``found`` with the ledger's EXTRA_SYNC warning for this rank's windows; the warning
    replaces the sync-flag rule's EXTRA_SYNC note (the same cost, now measured)."""
    # (a two-pass step's ledger holds its first pass's syncs too, which the method needs:
    # not judged)
    judged = [(w, c) for w in windows if w.get("engine") != "deepspeed"
              and not w.get("restarts") for c in [window_comm(w)] if c is not None]
    hits = [(w, c) for w, c in judged if c.extra_calls]
    if not hits:
        return found
    w, c = hits[0]
    engine = str(w.get("engine") or "local")
    n = c.backwards
    micros = [m + 1 for m in c.extra_micros]
    every = len(micros) == n - 1
    which = "every micro-step" if every else f"backward(s) {micros} of the window's {n}"
    mism = w.get("sync_mismatch") or []
    noop = (engine == "ddp" and bool(mism))
    closed = {"ddp": f"one all-reduce of each DDP bucket ({c.final_calls} call(s), "
                     f"{_size(c.final_bytes)}) at the window's last backward",
              "fsdp2": f"one reduce-scatter per FSDP2 group ({c.final_calls} call(s), "
                       f"{_size(c.final_bytes)}) at the window's last backward"}.get(
        engine, f"one reduction of the gradient ({c.final_calls} call(s), "
                f"{_size(c.final_bytes)}) after the window's last backward")
    if c.extra_s is not None and c.window_s:
        share = (f"; the extra calls took {c.extra_s:.3g} s, "
                 f"{100 * c.extra_s / float(c.window_s):.0f} % of the step's "
                 f"{float(c.window_s):.3g} s")
    else:
        share = ("; their time is not measurable from Python (DDP's C++ all-reduces overlap "
                 "the backward): `accumguard advise -- CMD` measures the step with the "
                 "deferral applied")
    why = (f" no_sync() was entered after the forward on micro-step(s) {[m + 1 for m in mism]}:"
           " it wraps only the backward, and DDP had already decided at the forward to "
           "all-reduce, so the deferral does nothing." if noop else "")
    ev = (f"collective ledger, optimizer step {int(w['step']) + 1} ({len(hits)} of "
          f"{len(judged)} step(s) like it): {c.final_calls + c.extra_calls} gradient "
          f"collective(s), {_size(c.final_bytes + c.extra_bytes)} per optimizer step, "
          f"where the closed form for {engine} with deferred sync is {closed}: "
          f"{c.extra_calls} extra collective(s), {_size(c.extra_bytes)} more, on "
          f"{which}{share}.{why} " + (_SAME_GRADIENT if engine in ("ddp", "fsdp2") else _UNREAD))
    fix = _FIX.get(engine, _FIX_OTHER)
    if engine == "ddp" and c.static_graph:
        # measured with torch 2.13: no_sync under static_graph=True stops the run with an
        # internal assert in DDP's reducer, so the plain DDP fix would break this script
        fix = ("This DDP was built with static_graph=True, and DDP does not support no_sync() "
               "then (torch 2.13 stops with an internal assert in its reducer): to defer, "
               "build it without static_graph and run micro-steps 1..K-1 inside "
               "`with model.no_sync():`, forward and backward; or keep static_graph and "
               "accept the extra all-reduces.")
    if noop:
        fix = ("Enter model.no_sync() before the forward, not only around the backward: "
               "`with model.no_sync(): model(x) ... loss.backward()` for micro-steps 1..K-1.")
    warn = _mk("EXTRA_SYNC", "warning", rank, int(w["step"]), None, ev,
               title_=("deferral that does nothing: " if noop else "gradients synchronised "
                       f"on {which}: ") + f"{c.extra_calls} extra collective(s), "
               f"{_size(c.extra_bytes)} per optimizer step", fix=fix)
    kept = [f for f in found if not (f.cls == "EXTRA_SYNC" and f.severity == "note"
                                     and f.rank == rank and f.title.startswith("gradients"))]
    return [*kept, warn]


# -- a hand reduction of the accumulated gradient inside the window (F10) --------------------

def collectives_before(lines: list[JsonObject]) -> dict[int, set[int]]:
    """Per optimizer step of a run without a wrapper, the backward passes (0-based) that
    began after a gradient collective of the script's own (the collective ledger: a row
    after backward m, its count, precedes backward m; one inside backward m changes the
    gradient backward m + 1 begins on). Several optimizers stepping at one boundary share
    the window: the ledger is on the first one's record, the others take it."""
    out: dict[int, set[int]] = {}
    last: tuple[int, set[int]] | None = None  # (backwards, positions) of the previous step
    for w in lines:
        if str(w.get("engine") or "local") != "local":
            last = None
            continue
        c = window_comm(w)
        n = int(w.get("backwards", 0) or 0)
        if c is not None and c.extra_micros:
            last = (n, {j for m in c.extra_micros for j in (m, m + 1)})
        elif not (last is not None and not (w.get("comm") or {}).get("rows") and last[0] == n):
            last = None
        if last is not None:
            out[int(w.get("step", -1))] = last[1]
    return out


def resummed_findings(rank: int, windows: list[JsonObject], world: int) -> list[Finding]:
    """F10 for a hand-written reduction inside the backward (a post-accumulate-grad hook)
    that SUM-reduces a parameter's ``.grad`` the window had already summed over the ranks at
    an earlier micro-step (the ledger's ``resummed``), when nothing changed the gradient
    between the backwards and the optimizer then received 1/W of the total (the script
    divides once, at the step). No correct loop gives that: had nothing divided between the
    reductions, micro-batch m of K counts W^(K-m) times; had each reduction been followed by
    a division by W, the final one makes the gradient W x too small. Where the step did not
    divide by W (an average after each reduction), nothing is said here."""
    if world < 2:
        return []
    for w in windows:
        comm = w.get("comm")
        again = comm.get("resummed") if isinstance(comm, dict) else None
        cons = w.get("conservation")
        if not again or not isinstance(cons, dict) or str(w.get("engine") or "local") != "local":
            continue
        if not cons.get("ok") or cons.get("wipes") or int(w.get("zero_grads_between") or 0):
            continue
        c = float(cons.get("scale") or 1.0) / max(float(cons.get("clip") or 1.0), 1e-30)
        if abs(c * world - 1) > 0.05:
            continue
        n = int(w.get("backwards", 0) or 0)
        micros = ", ".join(str(int(m) + 1) for m in again)
        ev = (f"collective ledger and gradient checksums, optimizer step {int(w['step']) + 1}: "
              f"inside the backward of micro-step(s) {micros} of {n}, an all_reduce(SUM) ran on "
              "parameters' .grad tensors this window had already summed over the ranks at an "
              "earlier micro-step (the same tensors): the running total, already equal on every "
              f"rank, summed over the {world} ranks again; nothing changed .grad between the "
              f"backwards, and the optimizer received {c:.3g} x the final total (1/{world}). "
              "Had nothing divided between the reductions, micro-batch m of the window counts "
              f"{world}^(K-m) times against the last one's 1; had each reduction been followed "
              f"by a division by {world}, the step's division makes the gradient {world} x too "
              "small. Either way the update is not the large batch's")
        return [_mk("F10", "error", rank, int(w["step"]), None, ev,
                    title_=("gradients summed over the ranks again inside each backward: the "
                            "accumulated .grad all-reduced (SUM) at more than one micro-step"),
                    fix=("Reduce the accumulated gradient once per window: let the hook "
                         "all-reduce only in the last micro-step's backward (then divide by "
                         "W once), or reduce each micro-step's own gradient with a tensor hook "
                         "(p.register_hook) before it is added to .grad; DDP with no_sync does "
                         "this for you."))]
    return []


def coalesced_flush_findings(rank: int, windows: list[JsonObject]) -> list[Finding]:
    """F2 for a DeepSpeed window whose backwards all ran inside
    ``engine.coalesce_grad_reduction()`` (the step record's ``ds_coalescing``) while the
    collective ledger shows the gradient-sized flush after backwards before the last: the
    window spans several blocks. DeepSpeed documents one block per optimizer step: each exit's
    flush overwrites the reduced gradients (``averaged_gradients``) of the previous one, so
    only the last block's micro-batches reach the step. One block per window, its flush
    after the last backward, is silent; so is a window whose backwards were not all
    coalesced (the engine's own hooks then reduce inside the backwards)."""
    for w in windows:
        if str(w.get("source") or "") != "deepspeed" and str(w.get("engine") or "") != "deepspeed":
            continue
        n = int(w.get("backwards", 0) or 0)
        coal = w.get("ds_coalescing") or []
        if n < 2 or len(coal) != n or not all(coal):
            continue
        c = window_comm(w)
        early = [m for m in (c.extra_micros if c is not None else []) if 1 <= m <= n - 1]
        if c is None or not early:
            continue
        blocks = len(early) + 1
        ev = (f"collective ledger, optimizer step {int(w['step']) + 1}: all {n} backward passes "
              "ran inside engine.coalesce_grad_reduction(), and a gradient-sized reduction "
              f"({_size(c.final_bytes)}, the size of the window's final flush) ran after backward "
              f"pass(es) {', '.join(str(m) for m in early)} as well as after the last: the "
              f"window's backwards were split over {blocks} coalesced blocks, each flushed at "
              "its exit. DeepSpeed's flush writes the reduced gradients afresh at each exit "
              "(its documentation: one block per optimizer step, the flush overwrites "
              "averaged_gradients), so only the last block's micro-batches reach the step")
        return [_mk("F2", "error", rank, int(w["step"]), early[0] - 1, ev,
                    title_=(f"the window's backwards split over {blocks} "
                            "coalesce_grad_reduction() blocks: each flush overwrites the "
                            "previous one, only the last block reaches the optimizer"),
                    fix=("Run every backward of the window inside one "
                         "`with engine.coalesce_grad_reduction():` block and call "
                         "engine.step() after it (one block per optimizer step)."))]
    return []
