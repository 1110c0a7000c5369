"""Which K a run has (pure Python): the flag, what a framework declared at run time, the
DeepSpeed config, the script's own declaration (used when the run agrees with it), or the
windows observed (the most common size, each optimizer object's phase on its own, windows
that span two passes over a DataLoader left out)."""

from __future__ import annotations

from collections import Counter

from accumguard.observe._epochs import run_epochs_short
from accumguard.observe._groups import optimizer_groups
from accumguard.observe._records import DeclaredK, KResolution, RunRecording, StepWindow, _windows

__all__ = ["resolve_k", "spans_passes"]


def _inferred(rec: RunRecording, prefer: int | None = None) -> int | None:
    """The most common window, not counting windows that span two passes over a DataLoader
    (a leftover leaked into the next epoch is not the loop's K). A tie goes to ``prefer``
    (the K the script declares) when it is one of the tied sizes, else to the largest: a
    window shorter than K is a partial one (a resumed run's first, an epoch's last), so a
    short run of one resumed window and one whole one is K, not the partial size."""
    per_rank = [_windows(steps) for steps in rec.steps.values()]
    phases = [ph for ws in per_rank for ph in _serial_phases(ws)]
    scheduled = any(end.get("k_changes") for end in rec.end.values())
    if len(phases) > len(per_rank) and not scheduled:  # (a K set per epoch is judged per epoch)
        # one optimizer object after another on a rank (training, then a large-batch
        # reference with its own optimizer stepping whole windows): each phase's own K, the
        # largest wins, so a reference of more single-backward steps does not make the
        # training's K 1
        ks = [k for ph in phases if (k := _mode_window(ph, prefer)) is not None]
        return max(ks) if ks else None
    return _mode_window([w for ws in per_rank for w in ws], prefer)


def _serial_phases(windows: list[StepWindow]) -> list[list[StepWindow]]:
    """Runs of consecutive windows of one optimizer object, when every object's windows are
    one contiguous run (sequential phases); otherwise one group of all of them."""
    phases: list[list[StepWindow]] = []
    seen: set[int | None] = set()
    for w in windows:
        serial = w.opt_serial
        if phases and phases[-1][0].opt_serial == serial:
            phases[-1].append(w)
            continue
        if serial is None or serial in seen:
            return [windows]  # interleaved optimizers, or no serials recorded
        seen.add(serial)
        phases.append([w])
    return phases


def _mode_window(windows: list[StepWindow], prefer: int | None) -> int | None:
    inside = [w for w in windows if not spans_passes(w)]
    sizes = [w.window for w in (inside or windows) if w.window > 0]
    if not sizes:
        return None
    counts = Counter(sizes)
    top = max(counts.values())
    tied = [s for s, c in counts.items() if c == top]
    return prefer if prefer in tied else max(tied)


def _inferred_per_optimizer(rec: RunRecording) -> dict[int, int]:
    """With several optimizers on their own windows (``optimizer_index``), each one's most
    common window (over the ranks); empty otherwise."""
    sizes: dict[int, list[int]] = {}
    for steps in rec.steps.values():
        groups = optimizer_groups(steps)
        if len(groups) < 2:
            continue
        for idx, group in groups:
            if idx is not None:
                sizes.setdefault(idx, []).extend(
                    w.window for w in _windows(group)
                    if w.window > 0 and not spans_passes(w))
    return {i: Counter(v).most_common(1)[0][0] for i, v in sizes.items() if v}


def spans_passes(w: StepWindow) -> bool:
    return any(0 < j < w.window for j in w.data_pass_starts or [])


def resolve_k(rec: RunRecording, flag: int | None, script: DeclaredK | None = None
              ) -> KResolution:
    """K from the flag, from what the run declared at run time (Accelerate, HF, Lightning,
    DeepSpeed GA > 1), from the script's source, or inferred from the windows.

    A K the script declares is used as declared only when the run agrees with it (its
    most common window is K), when every window has one backward (the F1 signature,
    judged by :func:`_f1`), or when every window is a whole epoch shorter than K (the
    run cannot reach K); otherwise the inferred K is used and a note says the two differ.
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
    inferred = _inferred(rec, script.value if script is not None else None)
    per_opt = _inferred_per_optimizer(rec)
    if per_opt:  # several optimizers, each with its own window: the accumulating one's K
        inferred = max(per_opt.values())
    if (script is not None and script.value is not None and script.value >= 1
            and (inferred is None or inferred in (1, script.value)
                 or (not per_opt and run_epochs_short(rec, script.value)))):
        # windows of one backward against a declared K > 1 is the F1 question (_f1); epochs
        # shorter than K cannot show K (each step closes one: _epochs)
        return KResolution(script.value, f"declared in the script ({script.where})",
                           "script", script)
    if inferred is None:
        stepped = any(rec.steps.values())
        return KResolution(None, "no backward pass seen before the optimizer steps (gradients "
                           "made another way, e.g. torch.autograd.grad, are not followed)"
                           if stepped else "no optimizer step", "none", script)
    if per_opt:
        each = ", ".join(f"optimizer #{i}: {n}" for i, n in sorted(per_opt.items()))
        return KResolution(inferred, f"inferred from each optimizer's own windows ({each})",
                           "inferred", script)
    return KResolution(inferred, "inferred from the observed windows", "inferred", script)
