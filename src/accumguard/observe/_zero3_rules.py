"""F3 under DeepSpeed ZeRO-3: a backward that copied its gradient over the window's previous
one (pure Python).

ZeRO-3 decides per backward whether to add the gradient to what the window holds or to copy
it over: it copies at ``micro_step_id`` 0, and it advances that id in the engine's own
forward (``engine(x)``), after a backward ran. A model called past the engine's forward
(``engine.module.encode(x)``, a method of the module) keeps the id at 0: every backward of
the window copies over the one before, and only the last micro-batch reaches the step. The
observer reads the id at each ``engine.backward`` (``StepRecord.ds_micro_ids``); two
backwards of one window at the same id are the proof, unless they ran inside
``coalesce_grad_reduction`` (the id stays put there by design).
"""

from __future__ import annotations

from accumguard.observe._records import Finding, JsonObject, StepWindow, _mk, _n

__all__ = ["zero3_overwrite_findings"]


def zero3_overwrite_findings(rank: int, windows: list[StepWindow], info: JsonObject) -> list[Finding]:
    """F3 (error) for the first window of a ZeRO-3 engine in which two consecutive backwards
    ran at the same ``micro_step_id``, with how many windows show it."""
    if info.get("engine") != "deepspeed" or info.get("zero_stage") != 3:
        return []
    hit: list[tuple[StepWindow, int, int]] = []
    for w in windows:
        ids = list(w.ds_micro_ids or [])
        if len(ids) < 2 or len(ids) != int(w.window) or any(i is None for i in ids):
            continue
        coal = list(w.ds_coalescing or []) + [False] * len(ids)
        # (inside coalesce_grad_reduction the id stays put by design: the block is reduced
        # once at its end, from gradients summed outside the partitions)
        same = next((j for j in range(1, len(ids)) if ids[j] == ids[j - 1]
                     and not coal[j] and not coal[j - 1]), None)
        if same is not None:
            hit.append((w, same, int(ids[same] or 0)))
    if not hit:
        return []
    w, j, mid = hit[0]
    judged = sum(1 for x in windows if len(x.ds_micro_ids or []) >= 2)
    return [_mk("F3", "error", rank, w.step, j,
                f"ZeRO-3 (DeepSpeed): at optimizer step {_n(w.step)} backwards {j} and {j + 1} "
                f"of the window's {w.window} both ran at the optimizer's micro_step_id {mid}, "
                "which DeepSpeed advances in the engine's own forward: no forward ran through "
                "the engine between them (the model was called past it, e.g. engine.module or "
                "a method of the module), so the later backward copied its gradient over the "
                f"window's instead of adding to it ({len(hit)} of {judged} windows): the "
                "earlier micro-batches never reach the step",
                title_="ZeRO-3 overwrote the window's gradient: no forward through the engine "
                       "between backwards",
                fix="Run every training forward through the engine (engine(x)); to use another "
                    "method of the model, dispatch it from the module's forward (an argument "
                    "that selects it), so DeepSpeed's forward runs each time.")]
