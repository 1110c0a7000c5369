"""From the per-rank recordings of ``accumguard watch`` to findings (pure Python).

Each finding names a failure class of :mod:`accumguard.core.taxonomy`, the rank, the
optimizer step and micro-step, the evidence and the fix. Severity is honest: an
``error`` names a mathematical difference in what the optimizer receives; a correct
but wasteful pattern (syncing every micro-step, ``no_sync`` spanning only the
backward) is a ``note`` with the measured extra collectives.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accumguard.core.taxonomy import fix_for, title

__all__ = ["Finding", "RunRecording", "analyze", "load_recordings"]


@dataclass(frozen=True)
class Finding:
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
    return Finding(cls, severity, rank, step, micro, evidence, fix_for(cls), title(cls))


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
        carry = 0
        out.append(w)
    return out


def resolve_k(rec: RunRecording, flag: int | None) -> tuple[int | None, str]:
    """K from the flag, from what the run declared, or inferred from the pattern."""
    if flag:
        return flag, "--accumulation-steps"
    for end in rec.end.values():
        for source, k in (end.get("declared_k") or {}).items():
            if isinstance(k, int) and k >= 1:
                return k, f"declared by {source}"
    for info in rec.engine.values():
        k = info.get("gradient_accumulation_steps")
        if isinstance(k, int) and k > 1:
            return k, "DeepSpeed config gradient_accumulation_steps"
    sizes = [w["window"] for steps in rec.steps.values() for w in _windows(steps)]
    if not sizes:
        return None, "no optimizer step"
    return Counter(sizes).most_common(1)[0][0], "inferred from the observed windows"


def analyze(rec: RunRecording, *, k_flag: int | None = None) -> tuple[list[Finding], int | None,
                                                                      str]:
    """All findings of the run, K and where K came from."""
    k, k_source = resolve_k(rec, k_flag)
    declared = k_flag is not None or not k_source.startswith("inferred")
    findings: list[Finding] = []
    for rank in rec.ranks:
        steps = rec.steps.get(rank, [])
        info = rec.engine.get(rank, {})
        findings += _rank_findings(rank, steps, info, k, declared)
        findings += _scheduler_findings(rank, rec.schedulers.get(rank, []))
    findings += _cross_rank(rec)
    # one finding per (class, rank) is enough to act on; keep the first
    seen: set[tuple[str, int | None, str]] = set()
    unique = []
    for f in findings:
        key = (f.cls, f.rank, f.severity)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, k, k_source


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
                               f"ZeRO-{stage}: backward passes {early} of a window of {n} ran at "
                               "an engine accumulation boundary (gradient_accumulation_steps="
                               f"{ds_ga}); each one resets the engine's gradient partition, so "
                               "only the last micro-batch reaches the optimizer"))
                continue
        cons = w.get("conservation")
        if cons and not cons.get("ok", True):
            if cons.get("reason") == "stale":
                out.append(_mk("F7", "error", rank, step, 0,
                               f"gradient left from before this window (relative size "
                               f"{cons['stale']:.3g}) reached optimizer step {step}: gradients "
                               "were not cleared after the previous step"))
            else:
                cls = "F3" if int(w.get("zero_grads_between", 0)) else "F2/F3"
                out.append(_mk(cls, "error", rank, step, None,
                               f"gradient conservation broken at step {step}: "
                               f"{cons['wiped']:.3g} (relative) of the window's accumulated "
                               f"gradient was removed between backward passes and the optimizer "
                               f"received {cons['received']:.3g} off the sum of the {n} "
                               "micro-steps' contributions"
                               + (f"; zero_grad() ran {w['zero_grads_between']} time(s) inside "
                                  "the window" if cls == "F3" else "")))
        # F8: clipping before the window's last backward
        early_clips = [c for c in (w.get("clip_micros") or []) if c < int(w["backwards"])]
        if early_clips:
            out.append(_mk("F8", "error", rank, step, early_clips[0] - 1,
                           f"clip_grad_norm_ ran after backward pass {early_clips[0]} of "
                           f"{w['backwards']} in the window ({len(w['clip_micros'])} clip calls "
                           "for one optimizer step)"))
        # F11 / notes: DDP sync pattern
        syncs = w.get("sync_micros") or []
        if w.get("engine") == "ddp" and syncs:
            mism = w.get("sync_mismatch") or []
            if syncs[-1] is False:
                out.append(_mk("F11", "error", rank, step, len(syncs) - 1,
                               "the window's last backward ran with DDP sync off at its forward "
                               "(require_backward_grad_sync=False / inside no_sync); the "
                               "optimizer stepped on this rank's unsynchronised gradient"
                               + (f"; the flag flipped between forward and backward on "
                                  f"micro-step(s) {mism}" if mism else "")))
            else:
                extra = sum(1 for s in syncs[:-1] if s)
                if extra:
                    how = (f" (no_sync entered after the forward on micro-step(s) {mism}: it "
                           "only wraps the backward, DDP had already decided to reduce)"
                           if mism else "")
                    out.append(_mk("OK", "note", rank, step, None,
                                   f"correct but wasteful: {extra} extra gradient all-reduce "
                                   f"round(s) per optimizer step on non-final micro-steps{how}; "
                                   "run forward and backward of micro-steps 0..K-2 inside "
                                   "model.no_sync() to save them"))
        # window sizes against K
        if k is not None and k > 1 and n > k and not (isinstance(ds_ga, int) and ds_ga > 1
                                                      and n == ds_ga):
            out.append(_mk("F13", "error" if declared or n > k else "note", rank, step, n - 1,
                           f"a window of {n} backward passes before optimizer step {step}; "
                           f"K = {k}"))
    if k is not None and k > 1 and declared and windows:
        ones = [w for w in windows if w["window"] == 1]
        if len(ones) >= max(2, len(windows) // 2):
            out.append(_mk("F1", "error", rank, ones[0]["step"], 0,
                           f"{len(ones)} of {len(windows)} optimizer steps came after a single "
                           f"backward pass; K = {k}"))
        short = [w for w in windows[:-1] if 1 < w["window"] < k]
        if len(short) >= 2 and all(w["window"] == k - 1 for w in short):
            out.append(_mk("F13", "error", rank, short[0]["step"], None,
                           f"{len(short)} windows of {k - 1} backward passes; K = {k}"))
    # F9: DeepSpeed's default clipping active on a run that did not ask for it
    clip = info.get("gradient_clipping")
    if info and clip and not info.get("clipping_set_by_user", True):
        norms = [(s["step"], s.get("grad_norm")) for s in steps if s.get("grad_norm") is not None]
        hit = [(st, nm) for st, nm in norms if nm > clip * (1 + 1e-6)]
        if hit:
            out.append(_mk("F9", "error", rank, hit[0][0], None,
                           f"the DeepSpeed config does not set gradient_clipping, the engine "
                           f"clips at {clip:g}, and the gradient norm was {hit[0][1]:.4g} at "
                           f"step {hit[0][0]}: every such update was shrunk"))
        elif norms:
            out.append(_mk("F9", "note", rank, None, None,
                           f"DeepSpeed clips at {clip:g} by default (gradient_clipping not set); "
                           "no step exceeded it in this run"))
    return out


def _scheduler_findings(rank: int, events: list[dict[str, Any]]) -> list[Finding]:
    for e in events:
        if not e.get("in_step") and int(e["count"]) > int(e["optimizer_steps"]) + 1:
            return [_mk("F4", "error", rank, int(e["step"]), int(e["micro"]),
                        f"the LR scheduler stepped {e['count']} times while its optimizer "
                        f"stepped {e['optimizer_steps']} times")]
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
        sums = {r: s.get("checksum") for r, s in row.items() if s.get("checksum")}
        if len(sums) < 2:
            continue
        vals = list(sums.values())
        scale = max(abs(v[2]) for v in vals) or 1e-30
        spread = max(abs(a[i] - b[i]) for a in vals for b in vals for i in (0, 1))
        if spread > 1e-5 * scale:
            text = ", ".join(f"rank {r}: {v[0]:.6g}" for r, v in sorted(sums.items()))
            return [_mk("F11", "error", None, step, None,
                        f"the gradient the optimizer received differs across ranks at step "
                        f"{step} (checksums {text}): ranks train different models")]
    return []
