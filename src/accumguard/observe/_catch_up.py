"""A scheduler fast-forwarded for a resume: made after the run stopped and stepped B times
before its optimizer's first step (``for _ in range(done): sched.step()``, the idiom that
predates ``load_state_dict``). Those B steps put the schedule where the run left it when B
is the number of optimizer steps the run made, which a process that trained before the
resume shows as the final count of the scheduler it replaced; K x that number is the
schedule fast-forwarded by micro-batches (F4). The catch-up steps are then not steps "per
micro-step": the scheduler rule judges the steps after it from its new position
(pure Python, no torch)."""

from __future__ import annotations

from collections import Counter

from accumguard.observe._records import Finding, JsonObject, StepWindow, _mk, _n

__all__ = ["catch_up"]


def catch_up(rank: int, events: list[JsonObject], windows: list[StepWindow] | None
             ) -> tuple[dict[object, int], list[Finding]]:
    """Per scheduler (``sid``), the steps it was fast-forwarded by before its optimizer's
    first step (the offset the scheduler rule discounts), and the findings: F4 when the
    catch-up is K x the steps the scheduler it replaced made, a note when nothing in the
    process tells how far the run had gone."""
    order: list[object] = []
    for e in events:
        if e.get("sid") not in order:
            order.append(e.get("sid"))
    offsets: dict[object, int] = {}
    found: list[Finding] = []
    sizes = Counter(int(w.window) for w in windows or [] if int(w.window) > 0)
    k = sizes.most_common(1)[0][0] if sizes else None
    for i, sid in enumerate(order):
        mine = [e for e in events if e.get("sid") == sid and not e.get("in_step")]
        burst = [e for e in mine if e.get("fresh")]
        if not burst or len(burst) == len(mine):
            continue  # never fast-forwarded, or its optimizer never stepped (nothing to judge)
        b = max(int(e["count"]) for e in burst)
        at = int(burst[0]["step"])
        before = [e for e in events if e.get("sid") == order[i - 1]] if i else []
        prev = max((int(e["count"]) for e in before), default=0)
        offsets[sid] = b
        if prev and b == prev:
            continue  # the schedule resumes where the one it replaced stopped
        if prev and k is not None and k > 1 and b == k * prev:
            found.append(_mk(
                "F4", "error", rank, at, None,
                f"a new LR scheduler was stepped {b} times before its optimizer's first step "
                f"(before optimizer step {_n(at)}: a resume fast-forwarding the schedule), "
                f"where the scheduler it replaced had stepped {prev} times, once per "
                f"optimizer step: {b} = K x {prev} (K = {k}, the windows' size), so the "
                "schedule was moved on by the micro-batches consumed, not the optimizer "
                f"steps made: from the resume on, every step's learning rate is the "
                f"schedule's {b - prev} steps further on than the large batch's",
                title_=f"a resumed LR schedule fast-forwarded by micro-batches (K = {k} x "
                       "the optimizer steps made)",
                fix="Fast-forward a rebuilt scheduler by the optimizer steps made (the saved "
                    "micro-step count // K), or save and load its state_dict()."))
        elif not prev:
            found.append(_mk(
                "F4", "note", rank, at, None,
                f"a new LR scheduler was stepped {b} times before its optimizer's first step "
                f"(before optimizer step {_n(at)}: a resume fast-forwarding the schedule); "
                "nothing in this process shows how many optimizer steps the run had made, "
                "so the catch-up is not judged (it should equal them, not the micro-batches "
                "consumed)",
                title_="a resumed LR schedule fast-forwarded (not judged)",
                fix="Nothing to fix if the catch-up counts optimizer steps; loading the "
                    "scheduler's state_dict() avoids the question."))
    return offsets, found
