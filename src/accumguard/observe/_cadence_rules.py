"""F14 from the loop's own cadence: windows of K_loop micro-steps that the optimizer steps
only every n = m x K_loop backwards (pure Python).

The loop states its window twice, and both can be measured: DDP or FSDP2 synchronised the
gradient at every K_loop-th backward only (``no_sync`` on the others, the collective
ledger), and every loss term of every micro-step was divided by that same K_loop (the loss
records' factor chains). When the optimizer nevertheless stepped once every m > 1 of those
windows, something between the loop and the optimizer gated the step a second time (an
optimizer wrapper counting its own calls, optax.MultiSteps-style, or an engine with an
accumulation of its own): the run makes m times fewer steps, each on the sum of m windows,
which no large batch of the loop's windows gives. Either statement alone proves nothing (a
loss divided by a constant the user chose; a wasteful sync, EXTRA_SYNC), so both are
required, on every judged window of the rank. No torch here.
"""

from __future__ import annotations

from accumguard.observe._comm_rules import WindowComm, window_comm
from accumguard.observe._records import DeclaredK, Finding, JsonObject, RunRecording, _mk

__all__ = ["double_gate_findings", "never_stepped_findings"]


def _loop_window(w: JsonObject, c: WindowComm) -> int | None:
    """K_loop when the window's syncs fell on every K_loop-th backward and every loss term
    of every micro-step was divided by K_loop (0: the syncs do, and the window holds no loss
    records: sampled out); None otherwise."""
    if w.get("engine") not in ("ddp", "fsdp2") or w.get("restarts") or not c.extra_micros:
        return None
    n = c.backwards
    syncs = [*sorted(c.extra_micros), n - 1]
    k = n // len(syncs)
    if k < 2 or n % len(syncs) or syncs != [k * (i + 1) - 1 for i in range(len(syncs))]:
        return None
    losses = [r for r in w.get("losses") or [] if isinstance(r, list) and len(r) > 9]
    if not losses:
        return 0
    if {int(r[2]) for r in losses} != set(range(n)):
        return None
    for r in losses:
        chain = [(str(op), float(v)) for op, v in r[9] or []]
        if ("/", float(k)) not in chain or ("*", float(k)) in chain \
                or ("*", float(n // k)) in chain:
            return None
        div = 1.0
        for op, v in chain:
            div *= v if op == "/" else 1.0
        if div >= n and abs(div / n - round(div / n)) < 1e-9:
            return None  # divided by the whole window too (`/ 4 / 2` over 8): right
    return k


def _declared_gate(rank: int, windows: list[JsonObject], script: DeclaredK) -> Finding | None:
    """F14 when the script declares K (a name it divides the loss by), every loss record of
    every window is divided by that K (and not by the window), and the optimizer stepped
    after m x K backwards, m > 1 the same in every window but possibly the run's last: the
    loop's windows of K gated a second time (an optimizer wrapper counting its own calls,
    called only at the loop's boundary)."""
    k = script.value
    if k is None or k < 2 or not script.divides_loss:
        return None
    ws = [w for w in windows if w.get("applied", True) and int(w.get("backwards", 0)) > 0]
    if len(ws) < 3:
        return None
    sizes = {int(w["backwards"]) for w in ws[:-1]}
    if len(sizes) != 1:
        return None
    n = sizes.pop()
    m = n // k
    if m < 2 or n % k:
        return None
    for w in ws[:-1]:
        losses = [r for r in w.get("losses") or [] if isinstance(r, list) and len(r) > 9]
        if not losses or {int(r[2]) for r in losses} != set(range(n)):
            return None
        for r in losses:
            chain = [(str(op), float(v)) for op, v in r[9] or []]
            div = 1.0
            for op, v in chain:
                div *= v if op == "/" else 1.0
            if ("/", float(k)) not in chain or div >= n:
                return None
    w = ws[0]
    return _mk("F14", "error", rank, int(w["step"]), None,
               f"{script.describe()}; but {sum(int(x['backwards']) == n for x in ws)} of "
               f"{len(ws)} optimizer step(s) came after {n} "
               f"backward passes each ({m} x K), every loss term divided by {k} only: the "
               f"step is gated a second time, so the run makes {m} times fewer steps than it "
               f"has windows of K, each on the sum of {m} windows ({m} x the mean gradient "
               "of the micro-batches it covers)",
               title_=f"the optimizer steps once every {m} of the script's windows of K = {k}: "
                      "the step is gated twice",
               fix="Gate the step once: call the accumulating wrapper's step() after every "
                   "backward and let it count, or drop the loop's own `if (i + 1) % K == 0` "
                   "and keep the wrapper's (or the other way round).")


def double_gate_findings(rank: int, windows: list[JsonObject], found: list[Finding],
                         script: DeclaredK | None = None) -> list[Finding]:
    """``found`` with an F14 error when every judged window of the rank is m > 1 of the
    loop's own windows (then the EXTRA_SYNC warning, which says the syncs cost time only,
    is dropped: they are the loop's window boundaries), or, ``script`` (the K the script
    declares, when the run's K was inferred otherwise), :func:`_declared_gate`."""
    judged = [(w, c) for w in windows if (c := window_comm(w)) is not None]
    loops = [_loop_window(w, c) for w, c in judged]
    read = {k for k in loops if k}
    if not judged or any(k is None for k in loops) or len(read) != 1:
        # (the measured windows first; the script's declaration only when they say nothing)
        if script is not None and (gate := _declared_gate(rank, windows, script)) is not None:
            kept = [f for f in found if not (f.cls == "EXTRA_SYNC" and f.rank == rank)]
            return [*kept, gate]
        return found
    k = read.pop()
    w = next(x for (x, _), kk in zip(judged, loops, strict=True) if kk)
    n = int(w["backwards"])
    m = n // k
    site = str(w["losses"][0][0])
    ev = (f"{len(judged)} of {len(judged)} optimizer step(s) came after {n} backward passes "
          f"each, while the loop's own windows are {k} micro-steps: the gradient was "
          f"synchronised at backwards {', '.join(str(k * (i + 1)) for i in range(m))} only "
          f"(the collective ledger) and every loss term was divided by {k} ({site}). The "
          f"optimizer stepped once every {m} of those windows, on their summed gradient: "
          f"{m} times fewer steps than the loop makes windows, each {m} times the gradient "
          "one window stands for")
    f14 = _mk("F14", "error", rank, int(w["step"]), None, ev,
              title_=f"the optimizer steps once every {m} of the loop's windows of {k}: "
                     "the step is gated twice",
              fix="Something between the loop and the optimizer gates the step again: an "
                  "optimizer wrapper that counts its own calls (optax.MultiSteps-style) or an "
                  "engine with an accumulation of its own. Gate once: call the wrapper's "
                  "step() after every backward and let it count, or set its accumulation to "
                  "1 and keep the loop's boundary.")
    kept = [f for f in found if not (f.cls == "EXTRA_SYNC" and f.rank == rank)]
    return [*kept, f14]


def never_stepped_findings(rec: RunRecording) -> list[Finding]:
    """F14 per rank that made no optimizer step at all while a DeepSpeed engine with GA > 1
    ran at least two windows' worth of ``engine.backward`` calls and ``engine.step()`` was
    never called: the engine counts its micro-steps, and steps, inside ``engine.step()``,
    so a script that calls it only at a boundary it asks the engine for (or counts itself
    on top of the engine's) never reaches an update."""
    out = []
    for rank in rec.ranks:
        end = rec.end.get(rank) or {}
        info = rec.engine.get(rank) or {}
        ga = info.get("gradient_accumulation_steps")
        pending = int(end.get("engine_backwards_pending") or 0)
        if (rec.steps.get(rank) or info.get("engine") != "deepspeed" or not isinstance(ga, int)
                or ga < 2 or end.get("engine_step_calls_pending") != 0 or pending < 2 * ga
                or int(end.get("steps") or 0)):
            continue
        out.append(_mk(
            "F14", "error", rank, None, None,
            f"{pending} backward passes through engine.backward() and not one engine.step() "
            f"call, with the DeepSpeed config's gradient_accumulation_steps = {ga}: DeepSpeed "
            "counts the micro-steps and steps its optimizer inside engine.step() (once every "
            f"{ga} calls), so no optimizer step ran at all; a step called only when "
            "engine.is_gradient_accumulation_boundary() is true never comes, since that "
            "boundary is counted by engine.step() itself",
            title_=f"the DeepSpeed engine never stepped: {pending} engine.backward() calls, "
                   "no engine.step()",
            fix="call engine.step() after every engine.backward(): DeepSpeed steps the "
                "optimizer itself at every gradient_accumulation_steps-th call (ask "
                "engine.is_gradient_accumulation_boundary() before engine.step() only for "
                "what else the script does once per step)"))
    return out
