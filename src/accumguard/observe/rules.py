"""The per-window rules: from recorded optimizer steps to findings (pure Python).

The ONE place that knows what a window of step records means. ``accumguard watch``
(:mod:`accumguard.runtime.watch_findings`) applies :func:`analyze` to the per-rank
recordings after the run; the framework callbacks (:mod:`accumguard.integrations`)
apply :func:`live_findings` to each :class:`~accumguard.observe.StepEvent` as it
happens. Both read a step as the dict :func:`step_record` makes of it (the line
``watch`` writes to ``rank-<R>.jsonl``).

Each finding names a failure class of :mod:`accumguard.core.taxonomy`, the rank, the
optimizer step and micro-step, the evidence and the fix. Severity is honest: an
``error`` names a mathematical difference in what the optimizer receives; a correct
but wasteful pattern (syncing every micro-step, ``no_sync`` spanning only the
backward) is a ``note`` with the measured extra collectives.

No torch here: the watch CLI analyses recordings without importing it.

Size (~1,150 lines): every per-window rule that turns observations into findings lives here on purpose, so that watch, the framework callbacks and the audit read one set of rules. Known debt: the loss-record rules (F5 from the per-call token weights, the cross-rank note, the window-scale rules LOSS_SCALE / F7 / F1-by-autograd.grad) and the F10/F12 scale rules are a self-contained block (~500 lines, from "token weights" on) that should be their own module.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from accumguard.core.taxonomy import fix_for, title

__all__ = ["NUMBERING", "WEIGHT_TOL", "WEIGHT_TOL_LOW_PRECISION", "DeclaredK", "Finding",
           "KResolution", "RunRecording", "analyze", "classify_token_weights",
           "conservation_class", "grad_step_findings", "live_findings", "load_recordings",
           "loss_scale_findings", "loss_weight_findings", "partial_window_findings",
           "low_precision_findings", "rank_scale_findings",
           "resolve_k", "step_record", "windows"]


class DeclaredK(Protocol):
    """A K the script's source declares (``runtime.watch_declared.DeclaredK`` is one)."""

    value: int | None
    divides_loss: bool

    @property
    def where(self) -> str: ...

    def describe(self) -> str: ...

#: One numbering in every output of ``watch`` and ``invariance`` (findings, tables, JSON):
#: optimizer steps and micro-steps count from 1. (The raw recording counts from 0.)
NUMBERING = "1-based: step 1 is the first optimizer step, micro-step 1 the first backward " \
            "of its window"


@dataclass(frozen=True)
class Finding:
    """One finding; ``step`` and ``micro`` are 1-based (:data:`NUMBERING`)."""

    cls: str
    severity: str  # "error" | "note"
    rank: int | None
    step: int | None
    micro: int | None
    evidence: str
    fix: str
    title: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunRecording:
    """Everything the ranks wrote: ``steps[rank]`` (step records), engine info, ends."""

    steps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    schedulers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    engine: dict[int, dict[str, Any]] = field(default_factory=dict)
    end: dict[int, dict[str, Any]] = field(default_factory=dict)
    world: int = 1

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.steps) | set(self.end))


def load_recordings(out_dir: Path) -> RunRecording:
    rec = RunRecording()
    for path in sorted(out_dir.glob("rank-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            kind = r.get("kind")
            if kind == "start":
                rank = int(r.get("rank", 0))
                rec.world = max(rec.world, int(r.get("world", 1)))
                rec.steps.setdefault(rank, [])
            elif kind == "step":
                rec.steps.setdefault(int(r["rank"]), []).append(r)
            elif kind == "scheduler":
                rec.schedulers.setdefault(rank, []).append(r)
            elif kind == "engine":
                rec.engine[rank] = r
            elif kind == "end":
                rec.end[rank] = r
    return rec


def _mk(cls: str, severity: str, rank: int | None, step: int | None, micro: int | None,
        evidence: str) -> Finding:
    """``step``/``micro``: the recording's 0-based indices, shown 1-based."""
    return Finding(cls, severity, rank, None if step is None else step + 1,
                   None if micro is None else micro + 1, evidence, fix_for(cls), title(cls))


def _n(step: int) -> int:
    """A recorded (0-based) step index as the user sees it."""
    return int(step) + 1


def step_record(event: Any, rank: int) -> dict[str, Any]:
    """The record of one :class:`~accumguard.observe.StepEvent` that the rules read (and
    ``watch`` writes as a JSON line): every field but the tensors of ``updates``.
    (Shallow: ``dataclasses.asdict`` deep-copied every list, on every step.)"""
    rec = {}
    for k in event.__dataclass_fields__:
        if k not in ("updates", "conservation"):
            v = getattr(event, k)
            rec[k] = list(v) if isinstance(v, list) else v
    cons = event.conservation
    rec["conservation"] = asdict(cons) if cons is not None else None
    return {"kind": "step", "rank": rank, **rec}


def conservation_class(cons: dict[str, Any], zero_grads_between: int) -> str:
    """The class of a broken conservation verdict: gradient left from the previous window
    (F7), removed by a ``zero_grad`` inside the window (F3), or removed by something else
    between backwards (F2/F3: an engine reset or a hand-written clear)."""
    if cons.get("reason") == "stale":
        return "F7"
    return "F3" if zero_grads_between else "F2/F3"


def live_findings(record: dict[str, Any], *, rank: int | None, k: int | None
                  ) -> list[Finding]:
    """The rules that one window decides on its own, applied as the step happens (the
    framework callbacks): conservation (F7/F3/F2/F3), clipping inside the window (F8),
    the last micro-step's sync flag (F11; wasteful syncs are notes), DeepSpeed double
    gating (F14) and boundary resets (F2), and a window longer than the declared K
    (F13, or F7 when it crossed into a new pass over the DataLoader). Rules that need
    the whole run (F1, F13 origin, F4 counts, cross-rank F11) stay in :func:`analyze`."""
    ws = _windows([record])
    if not ws:
        return []
    w = ws[0]
    out = _rank_findings(rank if rank is not None else 0, ws, {}, k, True)
    if rank is None:
        out = [Finding(f.cls, f.severity, None, f.step, f.micro, f.evidence, f.fix, f.title)
               for f in out]
    n = int(w["window"])
    if k is not None and k > 1 and n > k:
        leak = _spans_passes(w)
        out.append(_mk("F7" if leak else "F13", "error", rank, w["step"], n - 1,
                       f"{n} backward passes before one optimizer step (K = {k})"
                       + (": micro-steps left at the end of a pass over the DataLoader "
                          "leaked into the next pass's window" if leak else
                          f": the boundary comes {n - k} micro-step(s) late")))
    return out


def windows(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Public name of :func:`_windows` (applied steps, no-op steps folded in)."""
    return _windows(steps)


def _windows(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Applied steps with the backward passes of preceding no-op steps folded in (a step
    whose gradients were all None changes nothing: the window goes on)."""
    out = []
    carry = 0
    for s in steps:
        if not s.get("applied", True):
            carry += int(s["backwards"])
            continue
        w = dict(s)
        w["window"] = int(s["backwards"]) + carry
        if not carry:
            per = _backwards_per_micro(s)
            if per > 1:  # several losses of one forward, each with its own backward
                w["window"] = int(s["backwards"]) // per
                w["backwards_per_micro"] = per
        carry = 0
        out.append(w)
    return out


def _backwards_per_micro(s: dict[str, Any]) -> int:
    """Backward passes per micro-step when every micro-step runs the same number b > 1 of
    them on one forward (an actor and a critic loss, each with its own backward): the
    watched forwards before each backward are ``[f, 0, .., 0] * K`` with f > 0 and b - 1
    zeros. 1 otherwise (one backward per micro-step, or a pattern that is not regular)."""
    fw = s.get("forwards") or []
    if len(fw) < 2 or len(fw) != int(s.get("backwards", 0)) or not fw[0]:
        return 1
    heads = [i for i, f in enumerate(fw) if f]
    per = len(fw) // len(heads)
    if per < 2 or per * len(heads) != len(fw) or heads != list(range(0, len(fw), per)):
        return 1
    return per


@dataclass(frozen=True)
class KResolution:
    """K for the analysis, where it came from, and how much it can be trusted."""

    k: int | None
    source: str
    strength: str  # "flag" | "runtime" | "script" | "inferred" | "none"
    script: DeclaredK | None = None

    @property
    def declared(self) -> bool:
        return self.strength in ("flag", "runtime", "script")


def _inferred(rec: RunRecording) -> int | None:
    """The most common window, not counting windows that span two passes over a DataLoader
    (a leftover leaked into the next epoch is not the loop's K)."""
    windows = [w for steps in rec.steps.values() for w in _windows(steps)]
    inside = [w for w in windows if not _spans_passes(w)]
    sizes = [int(w["window"]) for w in (inside or windows) if int(w["window"]) > 0]
    return Counter(sizes).most_common(1)[0][0] if sizes else None


def _spans_passes(w: dict[str, Any]) -> bool:
    return any(0 < j < int(w["window"]) for j in w.get("data_pass_starts") or [])


def resolve_k(rec: RunRecording, flag: int | None, script: DeclaredK | None = None
              ) -> KResolution:
    """K from the flag, from what the run declared at run time (Accelerate, HF, Lightning,
    DeepSpeed GA > 1), from the script's source, or inferred from the windows.

    A K the script declares is used as declared only when the run agrees with it (its
    most common window is K) or when every window has one backward (the F1 signature,
    judged by :func:`_f1_from_script`); otherwise the inferred K is used and a note
    says the two differ.
    """
    if flag:
        return KResolution(flag, "--accumulation-steps", "flag")
    for end in rec.end.values():
        for source, k in (end.get("declared_k") or {}).items():
            if isinstance(k, int) and k >= 1:
                return KResolution(k, f"declared by {source}", "runtime")
    for info in rec.engine.values():
        k = info.get("gradient_accumulation_steps")
        if isinstance(k, int) and k > 1:
            return KResolution(k, "DeepSpeed config gradient_accumulation_steps", "runtime")
    inferred = _inferred(rec)
    if (script is not None and script.value is not None and script.value >= 1
            and (inferred is None or inferred in (1, script.value))):
        # windows of one backward against a declared K > 1 is the F1 question (_f1)
        return KResolution(script.value, f"declared in the script ({script.where})",
                           "script", script)
    if inferred is None:
        stepped = any(rec.steps.values())
        return KResolution(None, "no backward pass seen before the optimizer steps (gradients "
                           "made another way, e.g. torch.autograd.grad, are not followed)"
                           if stepped else "no optimizer step", "none", script)
    return KResolution(inferred, "inferred from the observed windows", "inferred", script)


def analyze(rec: RunRecording, *, k_flag: int | None = None, script: DeclaredK | None = None
            ) -> tuple[list[Finding], int | None, str]:
    """All findings of the run, K and where K came from. ``script``: the K the command's
    script declares (:func:`accumguard.runtime.watch_declared.declared_k`)."""
    res = resolve_k(rec, k_flag, script)
    findings: list[Finding] = []
    for rank in rec.ranks:
        steps = rec.steps.get(rank, [])
        info = rec.engine.get(rank, {})
        findings += _rank_findings(rank, steps, info, res.k, res.declared)
        findings += _window_findings(rank, _windows(steps), info, res)
        findings += _no_update(rank, steps)
        findings += _scheduler_findings(rank, rec.schedulers.get(rank, []))
        findings += loss_weight_findings(rank, _windows(steps))
        findings += loss_scale_findings(rank, _windows(steps), res.k, rec.world)
        findings += rank_scale_findings(rank, _windows(steps), rec.world)
        findings += low_precision_findings(rank, _windows(steps))
        findings += partial_window_findings(rank, _windows(steps), res.k)
        findings += grad_step_findings(rank, _windows(steps), res)
    findings += _cross_rank(rec)
    findings += _cross_rank_weights(rec)
    # one finding per (class, rank) is enough to act on; keep the first
    seen: set[tuple[str, int | None, str]] = set()
    unique = []
    for f in findings:
        key = (f.cls, f.rank, f.severity)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, res.k, res.source


def _rank_findings(rank: int, steps: list[dict[str, Any]], info: dict[str, Any],
                   k: int | None, declared: bool) -> list[Finding]:
    out: list[Finding] = []
    windows = _windows(steps)
    ds_ga = info.get("gradient_accumulation_steps")
    stage = info.get("zero_stage")
    managed = info.get("managed_accumulation", True)
    for w in windows:
        n = w["window"]
        step = w["step"]
        # F14: DeepSpeed accumulates K itself and the loop runs several backwards per step()
        if (isinstance(ds_ga, int) and ds_ga > 1 and managed
                and int(w.get("max_backwards_per_engine_step", 0)) > 1):
            out.append(_mk("F14", "error", rank, step, None,
                           f"DeepSpeed gradient_accumulation_steps={ds_ga} and "
                           f"{w['max_backwards_per_engine_step']} backward passes per "
                           f"engine.step() call; the optimizer stepped after {n} backward "
                           "passes"))
            continue
        # F2: DeepSpeed ZeRO-1/2 reduced-and-reset at a non-final backward of the window
        bounds = w.get("ds_boundaries") or []
        coal = w.get("ds_coalescing") or []
        if stage in (1, 2) and managed and n > 1 and len(bounds) == int(w["backwards"]):
            early = [j for j, b in enumerate(bounds[:-1]) if b and not
                     (coal[j] if j < len(coal) else False)]
            if early:
                out.append(_mk("F2", "error", rank, step, early[0],
                               f"ZeRO-{stage}: backward passes {[j + 1 for j in early]} of a "
                               f"window of {n} ran at an engine accumulation boundary "
                               f"(gradient_accumulation_steps={ds_ga}); each one resets the "
                               "engine's gradient partition, so only the last micro-batch "
                               "reaches the optimizer"))
                continue
        early_clips = [c for c in (w.get("clip_micros") or []) if c < int(w["backwards"])]
        cons = w.get("conservation")
        clipped = bool(early_clips) and not int(w.get("zero_grads_between", 0))
        if cons and not cons.get("ok", True) and not (clipped and cons.get("reason") != "stale"):
            # (a clip between backwards shrinks the accumulated gradient: F8 below says so)
            dropped = _dropped_tail(w)
            if dropped:
                out.append(_mk("F7", "error", rank, step, dropped - 1,
                               _dropped_text(w, dropped)))
            elif cons.get("reason") == "stale":
                out.append(_mk("F7", "error", rank, step, 0,
                               f"gradient left from before this window (relative size "
                               f"{cons['stale']:.3g}) reached optimizer step {_n(step)}: "
                               "gradients were not cleared after the previous step"))
            else:
                cls = conservation_class(cons, int(w.get("zero_grads_between", 0)))
                out.append(_mk(cls, "error", rank, step, None,
                               f"gradient conservation broken at step {_n(step)}: "
                               f"{cons['wiped']:.3g} (relative) of the window's accumulated "
                               f"gradient was removed between backward passes and the optimizer "
                               f"received {cons['received']:.3g} off the sum of the {n} "
                               "micro-steps' contributions"
                               + (f"; zero_grad() ran {w['zero_grads_between']} time(s) inside "
                                  "the window" if cls == "F3" else "")))
        # F8: clipping before the window's last backward
        if early_clips:
            out.append(_mk("F8", "error", rank, step, early_clips[0] - 1,
                           f"{'/'.join(w.get('clip_functions') or ['gradient clipping'])} "
                           f"ran after backward pass {early_clips[0]} of {w['backwards']} in "
                           f"the window ({len(w['clip_micros'])} clipping call(s) for one "
                           "optimizer step)"))
        out += _sync_findings(rank, w)
    # F9: DeepSpeed's default clipping active on a run that did not ask for it
    clip = info.get("gradient_clipping")
    if info and clip and not info.get("clipping_set_by_user", True):
        norms = [(s["step"], s.get("grad_norm")) for s in steps if s.get("grad_norm") is not None]
        hit = [(st, nm) for st, nm in norms if nm > clip * (1 + 1e-6)]
        if hit:
            out.append(_mk("F9", "error", rank, hit[0][0], None,
                           f"the DeepSpeed config does not set gradient_clipping, the engine "
                           f"clips at {clip:g}, and the gradient norm was {hit[0][1]:.4g} at "
                           f"step {_n(hit[0][0])}: every such update was shrunk"))
        elif norms:
            out.append(_mk("F9", "note", rank, None, None,
                           f"DeepSpeed clips at {clip:g} by default (gradient_clipping not set); "
                           "no step exceeded it in this run"))
    return out


def _dropped_tail(w: dict[str, Any]) -> int:
    """Micro-steps at the end of a pass over the DataLoader that a ``zero_grad()`` at the
    start of the next pass cleared before any step (0: not that): the window spans two
    passes and conservation saw the gradient wiped exactly where the new pass began."""
    cons = w.get("conservation")
    if not isinstance(cons, dict) or cons.get("ok", True) or cons.get("reason") != "wiped":
        return 0
    j = cons.get("first_wipe")
    n = int(w.get("window", w.get("backwards", 0)))
    if (isinstance(j, int) and 0 < j < n and j in (w.get("data_pass_starts") or [])
            and int(w.get("zero_grads_between", 0))):
        return j
    return 0


def _dropped_text(w: dict[str, Any], j: int) -> str:
    cons = w["conservation"]
    n = int(w.get("window", w.get("backwards", 0)))
    return (f"{j} micro-step(s) at the end of a pass over the DataLoader (an epoch) were "
            f"never stepped: zero_grad() at the start of the next pass cleared their "
            f"gradient ({cons['wiped']:.3g} of the window's gradient, relative, removed "
            f"before backward pass {j + 1}), so optimizer step {_n(w['step'])} received only "
            f"the {n - j} micro-step(s) of the new pass: the partial window was dropped. "
            "Step (normalised by its own count) after the last micro-batch of each pass")


def _sync_findings(rank: int, w: dict[str, Any]) -> list[Finding]:
    """DDP (flag at the forward decides) and FSDP2 (flag at the backward decides): the
    window's last backward must synchronise; syncing earlier ones is only wasteful."""
    engine = w.get("engine")
    step = w["step"]
    if engine == "ddp":
        syncs = w.get("sync_micros") or []
        what = "DDP sync off at its forward (require_backward_grad_sync=False / inside no_sync)"
    elif engine == "fsdp2":
        syncs = w.get("sync_backward") or w.get("sync_micros") or []
        what = "FSDP2 gradient sync off (set_requires_gradient_sync(False))"
    else:
        return []
    if not syncs or any(s is None for s in syncs):
        return []
    mism = w.get("sync_mismatch") or [] if engine == "ddp" else []
    if syncs[-1] is False:
        synced = [j + 1 for j, s in enumerate(syncs) if s]
        return [_mk("F11", "error", rank, step, len(syncs) - 1,
                    f"the window's last backward (micro-step {len(syncs)} of {len(syncs)}) ran "
                    f"with {what}; the optimizer stepped on gradients not reduced across ranks"
                    + (f" (micro-step(s) {synced} synchronised: the flag is inverted)"
                       if synced else "")
                    + (f"; the flag flipped between forward and backward on micro-step(s) "
                       f"{[m + 1 for m in mism]}" if mism else ""))]
    extra = sum(1 for s in syncs[:-1] if s)
    if not extra:
        return []
    how = (f" (no_sync entered after the forward on micro-step(s) {[m + 1 for m in mism]}: "
           "it only wraps the backward, DDP had already decided to reduce)" if mism else "")
    fix = ("run forward and backward of micro-steps 1..K-1 inside model.no_sync()"
           if engine == "ddp" else "call model.set_requires_gradient_sync(False) before "
           "micro-steps 1..K-1 and True before the last")
    return [_mk("OK", "note", rank, step, None,
                f"correct but wasteful: {extra} extra gradient reduction round(s) per optimizer "
                f"step on non-final micro-steps{how}; {fix} to save them")]


def _window_findings(rank: int, windows: list[dict[str, Any]], info: dict[str, Any],
                     res: KResolution) -> list[Finding]:
    """Window sizes against K: F1 (one backward per step while K > 1 is declared), F13
    (a first window shorter than K, or windows constantly K-1 / K+1), F7 (a window longer
    than K among windows of K: leftover micro-steps of an epoch leaked into the next)."""
    k = res.k
    out: list[Finding] = []
    if not windows:
        return out
    sizes = [int(w["window"]) for w in windows]
    ds_ga = info.get("gradient_accumulation_steps")
    out += _f1(rank, windows, res)
    if k is None or k <= 1 or all(n == 1 for n in sizes):
        return out
    sev = "error" if res.declared else "note"
    # a first window shorter than K, followed by windows of K: the counter's origin is off
    rest = sizes[1:]
    steady = all(n <= k for n in rest) and 2 * rest.count(k) >= len(rest)  # windows of K after
    if len(sizes) >= 2 and sizes[0] < k and sizes[1] == k:
        out.append(_mk("F13", "error" if res.declared or (len(sizes) >= 3 and steady)
                       else "note", rank,
                       windows[0]["step"], sizes[0] - 1,
                       f"the first optimizer step came after {sizes[0]} backward pass(es), the "
                       f"next after {sizes[1]} (K = {k}): the boundary test counts from the "
                       "wrong origin (e.g. `i % K == 0` with i from 0); only the last window "
                       "of an epoch or run may be short"))
    engine_ga = isinstance(ds_ga, int) and ds_ga > 1
    long = [w for w in windows if int(w["window"]) > k  # (F14 explains double gating)
            and not (engine_ga and (int(w["window"]) == ds_ga
                                    or int(w.get("max_backwards_per_engine_step", 0)) > 1))]
    regular = sum(1 for n in sizes if n == k)
    if long and any(w.get("data_pass_starts") for w in windows):
        # DataLoader passes were seen: a long window that began in one pass (epoch) and
        # ended in the next is a leak; one inside a single pass is a late boundary
        crossed = [w for w in long if _spans_passes(w)]
        if crossed:
            w, n0 = crossed[0], int(crossed[0]["window"])
            j = next(j for j in w["data_pass_starts"] if 0 < j < n0)
            out.append(_mk("F7", "error", rank, w["step"], n0 - 1,
                           _dropped_text(w, j) if _dropped_tail(w) == j else
                           f"a window of {n0} backward passes (K = {k}) before optimizer step "
                           f"{_n(w['step'])}: {j} micro-step(s) left at the end of a pass over "
                           "the DataLoader (an epoch) were not stepped and leaked into the "
                           "next epoch's first window"))
        long = [w for w in long if w not in crossed]
        if long:
            n0 = int(long[0]["window"])
            out.append(_mk("F13", sev, rank, long[0]["step"], n0 - 1,
                           f"{len(long)} window(s) of {n0} backward passes inside one pass "
                           f"over the data (K = {k}), e.g. before optimizer step "
                           f"{_n(long[0]['step'])}: the boundary comes {n0 - k} micro-step(s) "
                           "late"))
        long = []
    if long:
        n0 = int(long[0]["window"])
        constant = len({int(w["window"]) for w in long}) == 1 and len(long) >= regular
        if constant:
            out.append(_mk("F13", sev, rank, long[0]["step"], n0 - 1,
                           f"{len(long)} window(s) of {n0} backward passes (K = {k}), e.g. "
                           f"before optimizer step {_n(long[0]['step'])}: the boundary comes "
                           f"{n0 - k} micro-step(s) late"))
        else:
            # a leak leaves no short window before the last; a loop whose windows vary
            # (a token budget per step) has short ones too: then only a note
            mid_short = any(n < k for n in sizes[:-1])
            # a leak needs an earlier window to leak from, and recurs once per epoch (equal
            # gaps); long windows from the first step on, or at uneven gaps, are a budget
            long_ids = {id(w) for w in long}
            at = [i for i, w in enumerate(windows) if id(w) in long_ids]
            periodic = len({b - a for a, b in zip(at, at[1:], strict=False)}) <= 1
            leak = (not mid_short and len({int(w["window"]) for w in long}) == 1
                    and regular > len(long) and at[0] > 0 and periodic)
            head = (f"a window of {n0} backward passes before optimizer step "
                    f"{_n(long[0]['step'])} among {regular} windows of K = {k}")
            out.append(_mk("F7", "error" if leak else "note", rank, long[0]["step"],
                           n0 - 1,
                           f"{head}: {n0 - k} micro-step(s) left over at the end of an epoch "
                           "(or data pass) were not stepped and leaked into the next window"
                           if leak else
                           f"{head} (window sizes {sorted(set(sizes))}): fine when the loop "
                           "sizes each window on purpose (a token budget per step) and "
                           "normalises by that window's count; if K is fixed, micro-steps "
                           "leaked into it from an earlier window"))
    short = [w for w in windows[1:-1] if 1 < int(w["window"]) < k]
    if res.declared and len(short) >= 2 and all(int(w["window"]) == k - 1 for w in short) \
            and len(short) >= regular:
        out.append(_mk("F13", "error", rank, short[0]["step"], None,
                       f"{len(short)} windows of {k - 1} backward passes; K = {k}"))
    return out


def _firm_k(res: KResolution) -> int | None:
    """K when the run declared it (flag, engine/framework at run time, or the script's
    source), never an inferred one: the F1 rules judge a step per micro-step against it."""
    if res.strength in ("flag", "runtime"):
        return res.k
    return res.script.value if res.script is not None else None


def _f1(rank: int, windows: list[dict[str, Any]], res: KResolution) -> list[Finding]:
    """Step every micro-step: K > 1 declared and (nearly) every window has one backward."""
    k, script = _firm_k(res), res.script
    if k is None or k <= 1:
        return []
    # one backward after K or more forwards: the window's losses were summed before one
    # backward (the same large-batch gradient), not a step per micro-step
    summed = [w for w in windows if int(w["window"]) == 1
              and max(w.get("forwards") or [0]) >= k]
    ones = [w for w in windows if int(w["window"]) == 1 and w not in summed]
    # nearly every window: epochs whose last window holds one micro-batch are not F1
    if len(ones) < 2 or 4 * len(ones) < 3 * (len(windows) - len(summed)):
        return []
    text = f"{len(ones)} of {len(windows)} optimizer steps came after a single backward pass"
    if res.strength in ("flag", "runtime"):
        return [_mk("F1", "error", rank, ones[0]["step"], 0, f"{text}; K = {k} ({res.source})")]
    assert script is not None
    if script.divides_loss and len(ones) >= len(windows) - 1:
        return [_mk("F1", "error", rank, ones[0]["step"], 0,
                    f"{text}, while the script declares K: {script.describe()}: each step "
                    f"applies one micro-batch's gradient divided by {k}")]
    return [_mk("F1", "note", rank, ones[0]["step"], 0,
                f"{text}, while the script declares K: {script.describe()}. If it meant to "
                "accumulate, the optimizer steps on every micro-step; pass "
                "--accumulation-steps to decide")]


def _no_update(rank: int, steps: list[dict[str, Any]]) -> list[Finding]:
    """Optimizer steps after backward passes in which no gradient reached the optimizer."""
    skipped = [s for s in steps if not s.get("applied", True)]
    if not skipped or not any(int(s.get("backwards", 0)) for s in steps):
        return []
    never = not any(s.get("applied", True) for s in steps)
    fsdp_off = [s for s in skipped if s.get("engine") == "fsdp2" and s.get("sync_backward")
                and not any(s["sync_backward"])]
    if not (never or fsdp_off):
        return []
    first = (fsdp_off or skipped)[0]
    why = (" (every backward ran with FSDP2 gradient sync off: set_requires_gradient_sync("
           "True) was never called before a window's last backward, so no gradient was "
           "reduced)" if fsdp_off else "")
    return [_mk("NO_UPDATE", "error", rank, first["step"], None,
                f"{len(skipped)} of {len(steps)} optimizer steps found every gradient None "
                f"(first: step {_n(first['step'])}; "
                f"{sum(int(s.get('backwards', 0)) for s in steps)} backward passes in the "
                f"whole run){why}: the parameters did not move")]


def _scheduler_findings(rank: int, events: list[dict[str, Any]]) -> list[Finding]:
    for e in events:
        if not e.get("in_step") and int(e["count"]) > int(e["optimizer_steps"]) + 1:
            micro = int(e["micro"])  # backward passes before it: after micro-step `micro`
            return [_mk("F4", "error", rank, int(e["step"]), micro - 1 if micro else None,
                        f"the LR scheduler had stepped {e['count']} times when its "
                        f"optimizer had stepped {e['optimizer_steps']} times (seen at "
                        f"micro-step {micro} of optimizer step {_n(int(e['step']))}): "
                        "it steps per micro-step or per process, not once per optimizer "
                        "step")]
    return []


def _cross_rank(rec: RunRecording) -> list[Finding]:
    """What reached the optimizer must agree across ranks on replicated-gradient engines."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2:
        return []
    by_step: dict[int, dict[int, dict[str, Any]]] = {}
    for r in ranks:
        for s in _windows(rec.steps[r]):
            by_step.setdefault(int(s["step"]), {})[r] = s
    for step in sorted(by_step):
        row = by_step[step]
        if len(row) < 2 or any(s.get("engine") == "fsdp2" for s in row.values()):
            continue
        sums: dict[int, list[float]] = {r: s["checksum"] for r, s in row.items()
                                        if s.get("checksum")}
        if len(sums) < 2:
            continue
        vals = list(sums.values())
        scale = max(abs(v[2]) for v in vals) or 1e-30
        spread = max(abs(a[i] - b[i]) for a in vals for b in vals for i in (0, 1))
        if spread > 1e-5 * scale:
            text = ", ".join(f"rank {r}: {v[0]:.6g}" for r, v in sorted(sums.items()))
            return [_mk("F11", "error", None, step, None,
                        f"the gradient the optimizer received differs across ranks at step "
                        f"{_n(step)} (checksums {text}): ranks train different models")]
    return []


# -- token weights (the probe of :mod:`accumguard.observe.tokens`) -------------------------

#: Relative spread below which token weights count as equal. The probe is exact up to fp32
#: rounding of one logsumexp (~1e-6 relative); real normalisation bugs differ by far more.
WEIGHT_TOL = 1e-3
#: With bf16/fp16 logits the gradient itself carries ~3 significant digits.
WEIGHT_TOL_LOW_PRECISION = 3e-2


def classify_token_weights(ranks: list[list[list[float]]], *, world_size: int,
                           averages_over_ranks: bool, accumulation_steps: int,
                           tol: float = WEIGHT_TOL) -> tuple[str, str] | None:
    """Name what the optimizer received from the probe records of one window:
    ``(class, evidence)``, or None when every valid token carried the weight ``1/N``
    (or there is nothing to judge).

    ``ranks[r]`` is rank r's records ``[n_i, Σ s·(1−p_y), Σ (1−p_y)]``, one per
    micro-step. Classes: F5 (each micro-batch normalised by its own count), F6 (each
    rank by its own count), F10 (off by the world size), F7 (a partial window scaled
    as a full one), LOSS_SCALE (any other factor).
    """
    rows = [(r, i, float(n), float(num), float(den)) for r, recs in enumerate(ranks)
            for i, (n, num, den) in enumerate(recs)]
    rows = [x for x in rows if x[2] > 0 and x[4] > 0]
    if not rows:
        return None
    total = sum(x[2] for x in rows)
    avg = 1.0 / world_size if averages_over_ranks else 1.0
    # w: the weight one token of micro-step i finally carries; exact means w * total == 1.
    ratio = [x[3] / x[4] * avg * total for x in rows]
    counts = [x[2] for x in rows]

    def flat(vals: list[float]) -> bool:
        lo, hi = min(vals), max(vals)
        return hi > 0 and (hi - lo) <= tol * hi

    def near(a: float, b: float) -> bool:
        return abs(a - b) <= tol * abs(b)

    lo, hi = min(ratio), max(ratio)
    if near(lo, 1.0) and near(hi, 1.0):
        return None
    per_micro = [r * n / total for r, n in zip(ratio, counts, strict=True)]  # w_i * n_i
    micro_steps = max(len(recs) for recs in ranks)
    seen = (f"micro-steps with {min(counts):g}..{max(counts):g} valid tokens (N={total:g} over "
            f"{len(rows)} micro-batches on {world_size} rank(s)) gave their tokens weights from "
            f"{lo:.4g}/N to {hi:.4g}/N; exact is 1/N for every token")
    if flat(ratio):
        r = (lo + hi) / 2
        if world_size > 1 and (near(r, world_size) or near(r, 1.0 / world_size)):
            return "F10", f"{seen}: every weight is {r:.4g}/N, off by the world size {world_size}"
        if micro_steps < accumulation_steps and near(r, micro_steps / accumulation_steps):
            return "F7", (f"{seen}: a partial window of {micro_steps} of {accumulation_steps} "
                          "micro-steps normalised as a full one")
        return "LOSS_SCALE", f"{seen}: every weight is {r:.4g}/N"
    if flat(per_micro):
        c = sum(per_micro) / len(per_micro)
        return "F5", (f"{seen}; each micro-step's tokens got the same total weight ({c:.4g}) "
                      f"whatever their count, i.e. a per-micro-batch mean (total weight "
                      f"{c * len(rows):.4g}, exact 1)")
    by_rank: dict[int, list[int]] = {}
    for j, x in enumerate(rows):
        by_rank.setdefault(x[0], []).append(j)
    if len(by_rank) > 1 and all(flat([ratio[j] for j in js]) for js in by_rank.values()):
        rank_mass = [sum(per_micro[j] for j in js) for js in by_rank.values()]
        if flat(rank_mass):
            return "F6", (f"{seen}; each rank's tokens got the same total weight whatever the "
                          "rank's count, i.e. a mean over ranks of rank-local means")
    return "LOSS_SCALE", seen


# -- per-token weights of the loss calls (:mod:`accumguard.observe._losses`) --------------

#: Relative spread below which the total weights of one call site's micro-steps count as
#: equal (the F5 signature). With F5 they are bitwise equal (the same 1/K reached every
#: call) or off by fp32 rounding of 1/(n_i K) (~1e-7); the token weights of a real bug
#: differ by the spread of the counts, kept at least 10x the mass spread (below).
MASS_TOL = 1e-4
MASS_TOL_LOW_PRECISION = 1e-2


def _spread(vals: list[float]) -> float:
    hi = max(abs(v) for v in vals)
    return (max(vals) - min(vals)) / hi if hi > 0 else 0.0


def _loss_groups(w: dict[str, Any]) -> dict[tuple[str, int], dict[int, list[Any]]]:
    """The window's loss records by (call site, order there), then by micro-step."""
    groups: dict[tuple[str, int], dict[int, list[Any]]] = {}
    for r in w.get("losses") or []:
        if len(r) > 8 and r[8]:
            continue  # made by torch.autograd.grad, not a backward of the window
        site, idx, micro = str(r[0]), int(r[1]), int(r[2])
        groups.setdefault((site, idx), {}).setdefault(micro, r)
    return groups


def _short(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{Path(path).name}:{line}" if path else site


def loss_weight_findings(rank: int | None, windows: list[dict[str, Any]]) -> list[Finding]:
    """F5, only when certain: a loss call site present in every micro-step of a window
    gave each micro-step's call the same total weight (``g`` for a mean, ``g·n`` for a
    sum) while their valid counts differed, so one token weighs ``c / n_i``: a
    per-micro-batch mean. Correct normalisations (sum / N, mean · n_i / N, equal counts,
    any constant factor such as a loss scale or Accelerate's division by K) give every
    token one weight; weights that differ in any other pattern (task weights) say
    nothing for certain and stay silent."""
    out: list[Finding] = []
    for w in windows:
        k = int(w.get("window", w.get("backwards", 0)))
        if k < 2 or int(w.get("zero_grads_between", 0)):
            # a zero_grad between backwards: not one accumulation window (F3, or a
            # GradScaler that skipped a step and rescaled: two windows seen as one)
            continue
        for (site, idx), by_micro in sorted(_loss_groups(w).items()):
            if len(by_micro) < k or any(m not in by_micro for m in range(k)):
                continue  # not in every micro-step of the window: nothing to compare
            recs = [by_micro[m] for m in range(k)]
            ns = [float(r[3]) for r in recs]
            ws = [float(r[4]) for r in recs]
            if not (all(x > 0 for x in ws) or all(x < 0 for x in ws)):
                continue
            ws = [abs(x) for x in ws]
            masses = [x * n for x, n in zip(ws, ns, strict=True)]
            low = any(bool(r[5]) for r in recs)
            tol_w = WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL
            tol_m = MASS_TOL_LOW_PRECISION if low else MASS_TOL
            sw, sm = _spread(ws), _spread(masses)
            if sw <= tol_w or sm > min(tol_m, sw / 10):
                continue
            total = sum(ns)
            red = str(recs[0][6])
            mass = sum(masses) / k
            out.append(_mk("F5", "error", rank, int(w["step"]), None,
                           f"{_short(site)}: the loss call there (reduction='{red}'"
                           + (f", call {idx + 1} at that line" if idx else "")
                           + f") saw {', '.join(f'{n:g}' for n in ns)} valid tokens in the "
                           f"{k} micro-steps of optimizer step {_n(w['step'])}, and each "
                           f"micro-step's tokens reached the optimizer with the same total "
                           f"weight ({mass:.4g}) whatever their count: one token weighed "
                           f"{min(ws):.4g} to {max(ws):.4g} ({max(ws) / min(ws):.3g}x apart) "
                           f"instead of one weight for all {total:g} tokens (1/N); "
                           + _mean_form(mass, k)))
            break
        if out:
            break
    return out


def _mean_form(mass: float, k: int) -> str:
    """How the per-micro-batch mean was scaled, from its total weight per micro-step (a
    GradScaler or an engine's loss scale multiplies it: only 1/K and 1 are named)."""
    if abs(mass * k - 1.0) <= 1e-3:
        return "a per-micro-batch mean divided by K"
    if abs(mass - 1.0) <= 1e-3:
        return (f"a per-micro-batch mean not divided by K either, so the window's gradient "
                f"is also {k}x the large-batch mean (a transformers Trainer skips its own /K "
                "when compute_loss is expected to use num_items_in_batch)")
    return f"a per-micro-batch mean scaled by {mass:.4g}"


def _cross_rank_weights(rec: RunRecording) -> list[Finding]:
    """A note (never an error): each rank gave its own tokens one weight, but the weights
    differ between ranks: each rank normalised by its own count and DDP averages the rank
    means (standard practice; the exact large batch divides by the global count)."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2:
        return []
    per_rank = {r: {int(w["step"]): w for w in _windows(rec.steps[r])} for r in ranks}
    for step in sorted(per_rank[ranks[0]]):
        rows = {r: per_rank[r].get(step) for r in ranks}
        if any(w is None or int(w.get("window", 0)) < 2 for w in rows.values()):
            continue
        groups = {r: _loss_groups(w) for r, w in rows.items() if w is not None}
        keys = set.intersection(*(set(g) for g in groups.values()))
        for key in sorted(keys):
            weights: dict[int, float] = {}
            low = False
            for r, g in groups.items():
                k = int(rows[r]["window"])  # type: ignore[index]
                recs = [g[key].get(m) for m in range(k)]
                if any(x is None for x in recs):
                    break
                ws = [abs(float(x[4])) for x in recs]  # type: ignore[index]
                low = low or any(bool(x[5]) for x in recs)  # type: ignore[index]
                if _spread(ws) > (WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL):
                    break  # not one weight within this rank: the per-rank rule decides
                weights[r] = sum(ws) / len(ws)
            else:
                if _spread(list(weights.values())) > (WEIGHT_TOL_LOW_PRECISION if low
                                                      else WEIGHT_TOL):
                    text = ", ".join(f"rank {r}: {v:.4g}" for r, v in sorted(weights.items()))
                    return [_mk("F6", "note", None, step, None,
                                f"{_short(key[0])}: every token of a rank carries one weight, "
                                f"but the weights differ between ranks at optimizer step "
                                f"{_n(step)} ({text}): each rank normalises by its own token "
                                "count and the ranks' gradients are then averaged. Standard "
                                "DDP practice, not the large-batch gradient: for the exact "
                                "one, all-reduce the window's token count")]
    return []


# -- the scale of the whole window (the loss record's mass; see :mod:`._losses`) -------------

@dataclass(frozen=True)
class _Mass:
    """What a window's recorded loss calls add up to: the total weight of their tokens
    (``mass``: 1 when the window's loss is normalised to the window), whether every
    micro-step had exactly one call that was the whole loss (``sole``), and the site."""

    mass: float
    per_micro: list[float]
    sole: bool
    low: bool
    site: str


def _window_mass(w: dict[str, Any], *, via_grad: bool = False) -> _Mass | None:
    """The mass of a window whose every micro-step (backward passes, or counted
    ``torch.autograd.grad`` calls with ``via_grad``) has a loss record; None otherwise."""
    recs = [r for r in w.get("losses") or []
            if len(r) > 8 and bool(r[8]) == via_grad]
    if not recs or (not via_grad and int(w.get("zero_grads_between", 0))):
        return None
    n = len({int(r[2]) for r in recs}) if via_grad else int(w.get("window", 0))
    by_micro: dict[int, list[Any]] = {}
    for r in recs:
        by_micro.setdefault(int(r[2]), []).append(r)
    if n < 1 or sorted(by_micro) != list(range(n)):
        return None
    vals = [float(r[4]) * float(r[3]) for r in recs]
    if not (all(v > 0 for v in vals) or all(v < 0 for v in vals)):
        return None
    per_micro = [sum(abs(float(r[4]) * float(r[3])) for r in by_micro[m]) for m in range(n)]
    sole = all(len(by_micro[m]) == 1 and bool(by_micro[m][0][7]) for m in range(n))
    return _Mass(sum(per_micro), per_micro, sole, any(bool(r[5]) for r in recs),
                 str(recs[0][0]))


def _near(a: float, b: float, low: bool) -> bool:
    return abs(a - b) <= (WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL) * abs(b)


def loss_scale_findings(rank: int | None, windows: list[dict[str, Any]], k: int | None,
                        world: int = 1) -> list[Finding]:
    """The loss divided by K twice: in every window of K micro-steps, each backward's root
    is one loss call's output times constants (nothing else in the loss: a weighted sum of
    several losses is not judged, whatever its weights) and the window's tokens weigh
    1/K in total instead of 1. No correct loop gives that: the optimizer receives G/K.
    On several ranks, 1/K can also be a loss divided by K·W before a hand-written
    all_reduce(SUM) when W = K: then only a note."""
    if k is None or k < 2:
        return []
    judged = [(w, m) for w in windows if int(w.get("window", 0)) == k
              for m in [_window_mass(w)] if m is not None and m.sole]
    if judged and all(_near(m.mass, float(k), m.low) and _unscaled(w, m.low)
                      for w, m in judged):
        return _times_k(rank, judged, k, world)
    if not judged or not all(_near(m.mass, 1.0 / k, m.low) for _, m in judged):
        return []
    w, m = judged[0]
    seen = (f"{_short(m.site)}: every backward's loss was that call's output times a "
            f"constant (nothing else in the loss), and in each window of K = {k} micro-steps "
            f"({len(judged)} judged) its tokens carried a total weight of "
            f"{m.per_micro[0]:.4g} per micro-step (1/K^2 = {1 / k ** 2:.4g}), "
            f"{m.mass:.4g} per window (1/K) instead of 1")
    if world > 1 and _near(1.0 / k, 1.0 / world, False):
        return [_mk("LOSS_SCALE", "note", rank, int(w["step"]), None,
                    f"{seen}. With {world} ranks this is also what a loss divided by K*W "
                    "gives before gradients are summed across ranks by hand "
                    "(all_reduce(SUM), correct); if DDP, FSDP or an engine averages them, "
                    "the loss is divided by K twice and the update is K times too small")]
    return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                f"{seen}: the loss is divided by K twice (e.g. in a model or loss wrapper "
                "and again in the loop, or by hand before accelerator.backward, "
                "engine.backward or a Trainer, which divide by K themselves). The optimizer "
                f"receives G/K: every update is {k}x too small (with SGD, an effective "
                f"learning rate of lr/{k}). Divide by K (or by the window's count) once")]


def rank_scale_findings(rank: int | None, windows: list[dict[str, Any]], world: int
                        ) -> list[Finding]:
    """F10 from what the step received: on DDP, whose synced last backward already averaged
    the gradient across ranks, the loop issued gradient collectives of its own (DDP's own
    reductions run in C++ and are not counted, so every counted one is the script's), and
    the optimizer received exactly c times the sum of the backwards (conservation checked,
    its residual within tolerance, no clipping in the window). c = W: a hand-written
    all_reduce(SUM) without /W; c = 1/W: averaged twice; c = 1: a redundant all-reduce
    (correct, a note). Anything else is not judged."""
    if world < 2:
        return []
    hits: list[tuple[dict[str, Any], float]] = []
    redundant: list[dict[str, Any]] = []
    for w in windows:
        cons = w.get("conservation")
        syncs = w.get("sync_micros") or []
        if (w.get("engine") != "ddp" or not syncs or syncs[-1] is not True
                or int(w.get("reductions", 0)) < 1 or int(w.get("clips", 0))
                or not isinstance(cons, dict) or not cons.get("ok", False)
                or float(cons.get("received", 1.0)) > WEIGHT_TOL):
            continue
        c = float(cons.get("scale", 1.0))
        if _near(c, float(world), False) or _near(c, 1.0 / world, False):
            hits.append((w, c))
        elif _near(c, 1.0, False) and int(w.get("reductions", 0)) >= int(cons.get("params", 1)):
            # (a note only for one collective per gradient tensor or more: a count or a
            # metric all-reduced before the first backward is not a gradient collective)
            redundant.append(w)
    if hits and len(hits) * 2 >= len(windows):
        w, c = hits[0]
        many = c > 1
        return [_mk("F10", "error", rank, int(w["step"]), None,
                    f"DDP averaged the gradient across the {world} ranks in the window's last "
                    f"(synced) backward, then the script issued {int(w.get('reductions', 0))} "
                    "gradient collective(s) of its own before the optimizer step, and the "
                    f"optimizer received {c:.4g} x the gradient the backwards produced "
                    f"(gradient conservation, {len(hits)} of {len(windows)} step(s)): "
                    + (f"an all_reduce(SUM) without /W, every update is {world}x too large"
                       if many else f"the gradient averaged twice, every update is "
                       f"{world}x too small")
                    + ". Remove the hand-written all-reduce (DDP already averages), or "
                    "average it exactly once")]
    if redundant:
        w = redundant[0]
        return [_mk("OK", "note", rank, int(w["step"]), None,
                    f"correct but wasteful: DDP averaged the gradient in the synced backward "
                    f"and the script issued {int(w.get('reductions', 0))} more gradient "
                    f"collective(s) per optimizer step that left it unchanged ({len(redundant)} "
                    "step(s)); drop the hand-written all-reduce")]
    return []


#: Unit roundoff of the low-precision gradient dtypes (as verify.tolerance, which observe
#: may not import).
_U_LOW = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
#: F12 is an error when the expected drift is this many times the precision's own floor.
F12_ERROR_FACTOR = 4.0
#: Windows shorter than this are not reported (the drift is below the precision floor).
F12_MIN_K = 4


def f12_drift(u: float, k: int) -> float:
    """Expected relative drift of K gradients summed in a dtype of unit roundoff u: each
    of the K-1 additions rounds with an error uniform in +-u of the running sum (standard
    deviation u/sqrt(3)), the running sum grows linearly, so the errors add up to about
    (u/sqrt(3)) * sqrt(K/3) = u*sqrt(K)/3 of the final sum (bf16, K = 32: 7.4e-3; measured
    on blind round 6's b12: 6.6e-3)."""
    return u * math.sqrt(k) / 3.0


def low_precision_findings(rank: int | None, windows: list[dict[str, Any]]
                           ) -> list[Finding]:
    """F12: the optimizer stepped bf16/fp16 parameters (a torch optimizer: DeepSpeed keeps
    fp32 gradient buffers; Accumulator(master_weights=True) and FSDP2's sharded fp32
    parameters step fp32) on a gradient that K backward passes summed in place in .grad
    (no zero_grad between them, and where conservation was checked, nothing removed
    between backwards: an fp32 gradient-buffer pattern clears .grad after each backward).
    The precision's own floor is 2u (a bf16 model's micro-step gradients already carry
    about u; verify.tolerance allows twice the reference's error at that compute
    precision); the expected drift u*sqrt(K)/3 is an error only from F12_ERROR_FACTOR
    times that floor (bf16: K >= 576), a warning below it."""
    judged = []
    for w in windows:
        u = _U_LOW.get(str(w.get("param_dtype") or "").replace("torch.", ""))
        n = int(w.get("window", 0))
        if (u is None or w.get("source", "torch") != "torch" or n < F12_MIN_K
                or int(w.get("zero_grads_between", 0))):
            continue
        cons = w.get("conservation")
        if not isinstance(cons, dict):
            continue  # unchecked: a hand-written clear or an fp32 buffer cannot be excluded
        if float(cons.get("wiped", 0.0)) > 0.0 or float(cons.get("received", 1.0)) > \
                WEIGHT_TOL_LOW_PRECISION:
            # gradients moved out between backwards, or never seen in .grad at all (an fp32
            # buffer filled by a post-accumulate hook): not summed in place
            continue
        judged.append((w, u, n, True))
    if not judged:
        return []  # no checked window showed the sum made in place in .grad
    w, u, n, _ = max(judged, key=lambda t: t[2])
    drift, floor = f12_drift(u, n), 2 * u
    dtype = str(w.get("param_dtype")).replace("torch.", "")
    error = drift >= F12_ERROR_FACTOR * floor
    k_err = math.ceil((F12_ERROR_FACTOR * floor * 3.0 / u) ** 2 - 1e-9)  # bf16: 576
    return [_mk("F12", "error" if error else "warning", rank, int(w["step"]), None,
                f"the optimizer stepped {dtype} parameters on a gradient that {n} backward "
                f"passes summed in place in {dtype} .grad ({len(judged)} window(s)): each "
                f"addition rounds to the {dtype} unit roundoff u = {u:.3g}, an expected drift "
                f"of about u*sqrt(K)/3 = {drift:.2g} (relative) from the exact sum of the "
                f"micro-step gradients, growing as sqrt(K), against a precision floor of "
                f"2u = {floor:.2g} for a {dtype} model"
                + (": clearly beyond it" if error else
                   f" (an error from K >= {k_err})")
                + ". Accumulate in fp32: accumguard's Accumulator(master_weights=True), fp32 "
                "gradient buffers, DeepSpeed bf16 with fp32 gradient accumulation, or FSDP2 "
                "with fp32 parameters and MixedPrecisionPolicy(param_dtype=bfloat16, "
                "reduce_dtype=float32)")]


def _unscaled(w: dict[str, Any], low: bool) -> bool:
    """The optimizer received the sum of the window's backwards as they were (conservation
    checked, common scale c = 1): nothing divided the gradient by hand before the step."""
    cons = w.get("conservation")
    if not isinstance(cons, dict) or not cons.get("ok", False):
        return False
    # ok alone is not enough: with no contribution seen in .grad (gradients moved to a
    # buffer by a post-accumulate hook) the fit is unmatched (received ~ 1) yet not "wiped"
    if float(cons.get("received", 1.0)) > (WEIGHT_TOL_LOW_PRECISION if low else WEIGHT_TOL):
        return False
    return _near(float(cons.get("scale", 1.0)), 1.0, low)


def _times_k(rank: int | None, judged: list[tuple[dict[str, Any], _Mass]], k: int,
             world: int) -> list[Finding]:
    """The loss never divided by K: every window of K weighs its tokens K (each micro-step's
    loss a full mean) and the optimizer receives the sum of the K gradients, K x G."""
    w, m = judged[0]
    clipped = any(int(x.get("clips", 0)) for x, _ in judged)
    seen = (f"{_short(m.site)}: every backward's loss was that call's output times a "
            f"constant (nothing else in the loss), and in each window of K = {k} micro-steps "
            f"({len(judged)} judged) its tokens carried a total weight of "
            f"{m.per_micro[0]:.4g} per micro-step, {m.mass:.4g} per window (K) instead of 1, "
            "and the optimizer received that sum unchanged (gradient conservation, scale 1)")
    if world > 1 and _near(float(k), float(world), False):
        return [_mk("LOSS_SCALE", "note", rank, int(w["step"]), None,
                    f"{seen}. With {world} ranks this is also what a loss multiplied by W "
                    "gives to undo DDP's average; if the loss is meant to be the window's "
                    "mean, it is not divided by K and the update is K times too large")]
    return [_mk("LOSS_SCALE", "error", rank, int(w["step"]), None,
                f"{seen}: the loss is not divided by K. The optimizer receives K x G, the sum "
                f"of the {k} micro-batch gradients instead of the large batch's mean: with "
                f"SGD every update is {k}x the large-batch step (an effective learning rate "
                f"of {k} x lr); with Adam the difference is nearly hidden (only epsilon"
                + (" and, here, gradient clipping, which sees a norm K times larger"
                   if clipped else " and any gradient clipping") + " change the update), "
                "but it is not the large-batch update. Divide each micro-step's loss by K "
                "(or normalise by the window's token count)")]


def partial_window_findings(rank: int | None, windows: list[dict[str, Any]],
                            k: int | None) -> list[Finding]:
    """F7 from the loss record: every full window of K micro-steps weighs its tokens 1 in
    total (the loop normalises a window to its mean), and the short last window of the
    run or of a pass over the data, n < K micro-steps, weighs them n/K: it was divided by
    K instead of its own n. (A last window normalised by its own size or count weighs 1;
    a dropped one is not there.)"""
    if k is None or k < 2:
        return []
    masses = [_window_mass(w) for w in windows]
    full = [m for w, m in zip(windows, masses, strict=True)
            if m is not None and int(w.get("window", 0)) == k]
    if not full or not all(_near(m.mass, 1.0, m.low) for m in full):
        return []
    for i, (w, m) in enumerate(zip(windows, masses, strict=True)):
        n = int(w.get("window", 0))
        if m is None or not 1 <= n < k:
            continue
        last = i == len(windows) - 1 or 0 in (windows[i + 1].get("data_pass_starts") or [])
        if last and _near(m.mass, n / k, m.low):
            return [_mk("F7", "error", rank, int(w["step"]), n - 1,
                        f"{_short(m.site)}: the last window before optimizer step "
                        f"{_n(w['step'])} had {n} of K = {k} micro-steps"
                        + (" (the end of the run)" if i == len(windows) - 1
                           else " (the end of a pass over the DataLoader)")
                        + f", and its tokens carried a total weight of {m.mass:.4g} = "
                        f"{n}/{k}, while each of the {len(full)} full window(s) seen "
                        f"carried 1: the partial window was divided by K instead of its "
                        f"{n} micro-steps, so its update is {m.mass:.3g}x its mean gradient")]
    return []


def grad_step_findings(rank: int | None, windows: list[dict[str, Any]],
                       res: KResolution) -> list[Finding]:
    """F1 for loops that make gradients with ``torch.autograd.grad`` and assign ``.grad``
    by hand (no backward pass is seen): K > 1 declared and every optimizer step came after
    one ``autograd.grad`` of the loss with respect to the parameters. A loop that
    accumulates several such calls before its step is silent, and so is ``autograd.grad``
    for a gradient penalty or a meta-gradient (``create_graph=True``, or inputs that are
    not parameters: not counted by the loss record)."""
    k, script = _firm_k(res), res.script
    if k is None or k <= 1 or any(int(w.get("window", 0)) for w in windows):
        return []  # backward passes seen: the window rules decide
    masses = [m for w in windows for m in [_window_mass(w, via_grad=True)] if m is not None]
    if len(masses) < 2 or any(len(m.per_micro) != 1 for m in masses):
        return []
    m = masses[0]
    scaled = _near(m.mass, 1.0 / k, m.low)
    text = (f"each of the {len(masses)} optimizer steps whose loss was recorded (of "
            f"{len(windows)}) came after a single torch.autograd.grad of the loss with respect to the "
            f"parameters ({_short(m.site)}; no backward pass: .grad assigned by hand), "
            f"while K = {k} ({res.source})")
    if res.strength in ("flag", "runtime") or scaled or (script and script.divides_loss):
        return [_mk("F1", "error", rank, int(windows[0]["step"]), 0,
                    f"{text}" + (f", and that loss weighed {m.mass:.4g} = 1/K" if scaled
                                 else "") + ": each step applies one micro-batch's "
                    "gradient; sum the K micro-steps' gradients before one step")]
    return [_mk("F1", "note", rank, int(windows[0]["step"]), 0,
                f"{text}. If it meant to accumulate, the optimizer steps on every "
                "micro-step; pass --accumulation-steps to decide")]
