"""From the per-rank recordings of ``accumguard watch`` to findings.

The rules themselves live one layer down, in :mod:`accumguard.observe.rules`, so that
the framework callbacks (:mod:`accumguard.integrations`) apply the same ones live;
this module is the name ``watch``, ``invariance`` and their tests import them by.
"""

from __future__ import annotations

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
           "collective_positions", "load_recordings", "resolve_k"]


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
