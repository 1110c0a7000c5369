"""From the per-rank recordings of ``accumguard watch`` to findings.

The rules themselves live one layer down, in :mod:`accumguard.observe.rules`, so that
the framework callbacks (:mod:`accumguard.integrations`) apply the same ones live;
this module is the name ``watch``, ``invariance`` and their tests import them by.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from accumguard.observe.rules import (
    NUMBERING,
    Finding,
    KResolution,
    RunRecording,
    analyze,
    load_recordings,
    resolve_k,
)

__all__ = ["NUMBERING", "Finding", "KResolution", "RunRecording", "analyze",
           "collective_positions", "load_recordings", "merge_ranks", "resolve_k"]


def merge_ranks(findings: list[Finding], ranks: list[int]) -> list[Finding]:
    """One finding for what several ranks found alike: the same class, severity, step
    and title (the micro-step of the first of them; the others' are in their words). Its evidence names the ranks (``rank`` None when every rank of
    the run found it, else the first of them); when their evidence differs, rank
    ``r``'s own words follow (up to three ranks, then their numbers only), so nothing one
    rank measured is hidden behind another's. Findings of one rank, or about the ranks'
    comparison (``rank`` None), are kept as they are, in their order."""
    groups: dict[tuple[object, ...], list[Finding]] = {}
    order: list[tuple[object, ...] | Finding] = []
    for f in findings:
        if f.rank is None:
            order.append(f)
            continue
        key = (f.cls, f.severity, f.step, f.title)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(f)
    out: list[Finding] = []
    for item in order:
        if isinstance(item, Finding):
            out.append(item)
            continue
        group = groups[item]
        if len(group) == 1:
            out.append(group[0])
            continue
        out.append(_merged(group, ranks))
    return out


def _merged(group: list[Finding], ranks: list[int]) -> Finding:
    first = group[0]
    who = sorted({int(f.rank) for f in group if f.rank is not None})
    every = len(ranks) > 1 and who == sorted(ranks)
    names = ", ".join(map(str, who))
    head = f"on every rank ({names})" if every else f"on ranks {names}"
    others = [f for f in group[1:] if f.evidence != first.evidence]
    if not others:
        text = f"{head}: {first.evidence}"
    else:
        shown = others[:3]
        rest = [int(f.rank) for f in others[3:] if f.rank is not None]
        text = (f"{head}, with different measurements per rank: rank {first.rank}: "
                f"{first.evidence}" + "".join(f"; rank {f.rank}: {f.evidence}" for f in shown)
                + (f"; ranks {', '.join(map(str, rest))} differ too (--json holds the "
                   "evidence of the first rank only)" if rest else ""))
    return replace(first, rank=None if every else first.rank, evidence=text)


def _where(c: dict[str, Any]) -> str:
    """``(call 7, step 3, micro-step 2)``: steps and micro-steps 1-based, as every report."""
    parts = [f"call {c.get('call')}"]
    step, micro = c.get("step"), c.get("micro")
    if step is not None:
        parts.append(f"step {int(step) + 1}")
        if c.get("in_backward"):
            parts.append(f"micro-step {int(micro or 0) + 1}, inside its backward")
        elif micro:
            parts.append(f"micro-step {int(micro)}")
        else:
            parts.append("before its first backward")
    return "(" + ", ".join(parts) + ")"


def collective_positions(rec: RunRecording) -> list[str]:
    """Per rank, the collective it was inside when it ended (or the last it finished), and
    the ops whose call counts differ between ranks: why a run that died in a
    process-group timeout (or was killed while hanging) hung, in the user's words.

    Only the collectives the Python functions issue are seen (not DDP's C++ bucket
    all-reduces, nor the ``wait()`` of an ``async_op`` handle)."""
    lines: list[str] = []
    calls: dict[int, dict[str, int]] = {}
    for rank in sorted(rec.end):
        state = rec.end[rank].get("collective")
        if not state:
            continue
        calls[rank] = dict(state.get("calls") or {})
        opened, done, failed = state.get("open"), state.get("last_done"), state.get("failed")
        if opened:
            line = (f"rank {rank} was waiting in {opened['op']} {_where(opened)} when the "
                    "run ended")
            if failed and failed.get("op") == opened["op"] and failed.get("call") == \
                    opened.get("call"):
                line += f"; it raised {failed.get('error')}"
            lines.append(line)
        elif done:
            lines.append(f"rank {rank} last finished {done['op']} {_where(done)}")
        if failed and not (opened and failed.get("call") == opened.get("call")
                           and failed.get("op") == opened.get("op")):
            lines.append(f"rank {rank}: {failed['op']} {_where(failed)} raised "
                         f"{failed.get('error')}")
    if len(calls) > 1:
        for op in sorted({o for c in calls.values() for o in c}):
            counts = {r: c.get(op, 0) for r, c in calls.items()}
            if len(set(counts.values())) > 1:
                lines.append(f"{op} was entered a different number of times on the ranks: "
                             + ", ".join(f"rank {r} {n}" for r, n in counts.items()))
    return lines
