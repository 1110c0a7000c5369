"""F4 and F13 claims that only the source can make, kept when the run confirms what they
rest on.

A learning-rate schedule written by hand (a callback that sets ``param_groups[i]["lr"]``
from a micro-batch counter, a timm-style ``step_update(num_updates)``, a horizon computed
from ``len(train_dataloader)``) has no horizon the run can read: ``watch`` sees the rates,
not the step number the schedule meant. ``lint`` reads that number in the source. Its F4
errors are kept in the watch report only when the run shows the two facts every such claim
rests on: the optimizer stepped once per K >= 2 backward passes, and the rate changed
during the run (a schedule acted); and only when the run's own rules said nothing about
the schedule (no F4 finding at any level: a file may hold several modes, and a rate the run
judged itself, as a token-count schedule's warning, is the run's word). A loss coefficient's
schedule (a KL controller moved on every micro-step) and a weight average or target network
updated on every micro-step need the windows only: the rate is not what they move.

A resume's arithmetic (the iteration counter restored one past the iteration the checkpoint
saved still to run: a whole window skipped) is not in the run either: its windows are K
long, only the batch never trained on is missing. Lint's F13 error on it is kept when the
run resumed (an optimizer's state was loaded) and the run's rules made no F13 error.

A Trainer subclass that says its loss is already scaled for accumulation
(``loss_is_scaled_for_ga = True``) while ``compute_loss`` returns a per-micro-batch mean (a
hand-built focal loss: no loss call the run records) makes each window K micro-batch means:
lint's LOSS_SCALE error is kept when the run's windows are K >= 2 backwards long.

A clip setting the Hugging Face Trainer never receives (a settings key that is no
``TrainingArguments`` field, dropped by ``parse_dict(allow_extra_keys=True)``; a config field
never passed) leaves the Trainer's default clip at 1.0: lint can only warn, since it changes
only updates whose norm exceeds 1. The run shows it: lint's warning is kept as an F9 error
when a norm clip shrank some update of the run (its factor read from the norm it returned).

A clip inside a gradient hook (an element-wise clamp from ``p.register_hook``) runs on each
backward's contribution, not on the window's sum; no clipping call shows it in the run.
Lint's F8 error on it is kept when the run's windows are K >= 2 backwards and its rules made
no F8 error.

A Trainer override that finds the window with a micro-batch counter of its own (a
per-update penalty on ``self._micro % K == 0``) stays on the Trainer's boundaries only while
every window is K long; lint can only warn. The run shows a short window before its end (an
epoch of no multiple of K): lint's warning is kept as an F13 error.

A DeepSpeed train batch written as micro-batch x K without the number of processes (a
config's ``train_batch_size`` with no ``gradient_accumulation_steps``, or
``engine.set_train_batch_size(micro * k)`` in a batch ramp) is right on one process and K / W
on W: lint can only warn. The run shows W: lint's warning is kept as an F1 error when a
DeepSpeed run had several ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import median
from typing import Any

from accumguard.observe._records import Finding, RunRecording, _mk

__all__ = ["clip_source_findings", "counter_source_findings", "hook_clip_source_findings",
           "resume_source_findings", "scale_source_findings", "schedule_source_findings",
           "world_source_findings"]

#: lint's warnings that the script's clip setting never reaches the HF Trainer (which then
#: clips at its default 1.0): whether that changed an update is the run's to show
_CLIP_CODES = ("AG326", "AG328", "AG177", "AG370")

#: lint's F4 rules about something other than the learning rate moved on every micro-step
#: (a loss coefficient's KL controller, AG330; a weight average or a target network's soft
#: update, AG158): the run need only show the windows, not a change of the learning rate
_WINDOW_ONLY_CODES = ("AG330", "AG158")

#: lint's LOSS_SCALE rules about a Trainer skipping its division by K on a per-micro-batch
#: mean (``loss_is_scaled_for_ga = True``; a ``compute_loss_func`` ignoring
#: ``num_items_in_batch``): the loss record cannot tell whose division is missing; and a
#: term added to ``.grad`` after every backward (AG369): the run sees the gradient grow, not
#: whether the term was divided by K; a loss term beside a term divided by K, not divided
#: itself (AG127: a regulariser built by hand, which the loss record does not hold); a loss
#: over ``num_items_in_batch`` skipping the pad id the Trainer counts (AG379: the record
#: holds the count, not which label values the loss skipped)
_SCALE_CODES = ("AG174", "AG336", "AG369", "AG127", "AG379")

#: lint's warning that a DeepSpeed train batch leaves out the number of processes (right on
#: one process only): the run shows how many it had
_WORLD_CODES = ("AG152",)

#: lint's F8 rules about a clip inside a gradient hook or a per-backward callback (a
#: ``p.register_hook`` clamp, ``on_after_backward``): no clipping call the run records may
#: show it, and it changes the update only when the window holds several backwards
_HOOK_CLIP_CODES = ("AG138", "AG319")

#: lint's warning that a Trainer override finds the window with a counter of its own, which
#: leaves the Trainer's boundaries at the first short window: the run shows such a window
_COUNTER_CODES = ("AG368",)

#: lint's F13 rules about a resume's own arithmetic (what the run cannot show)
_RESUME_CODES = ("AG318", "AG327", "AG329", "AG331", "AG332")


def _lint_hit(command: Sequence[str], keep: Callable[[Any], bool],
              levels: tuple[str, ...] = ("error",)) -> tuple[str, Any] | None:
    """(the script's file name, lint's first finding ``keep`` accepts) at ``levels``."""
    from accumguard.watch._declared import script_lint_errors

    found = script_lint_errors(command, levels=levels)
    hits = [] if found is None else [f for f in found[1] if keep(f)]
    return (found[0].name, hits[0]) if found is not None and hits else None


def _claim(cls: str, step: int, said: tuple[str, Any], shows: str, title: str | None = None) -> Finding:
    """The finding keeping lint's claim ``said``, with what the run ``shows``."""
    name, hit = said
    return _mk(cls, "error", None, step, None,
               f"{name}:{hit.line}: {hit.evidence} (read in the script, lint {hit.code}); {shows}",
               title_=title or hit.title, fix=hit.fix)


def _confirmed(rec: RunRecording) -> tuple[int, int, list[float]] | None:
    """(K, steps, the distinct rates in order) of the first rank with steps, when its
    optimizer stepped once per K >= 2 backwards (the median window)."""
    for r in rec.ranks:
        steps = [s for s in rec.steps.get(r, []) if s.get("applied", True)]
        if len(steps) < 2:
            continue
        k = int(median(int(s.get("backwards", 0) or 0) for s in steps))
        rates = [float(s["lr"]) for s in steps if isinstance(s.get("lr"), (int, float))]
        return (k, len(steps), list(dict.fromkeys(round(x, 12) for x in rates))) if k >= 2 else None
    return None


def schedule_source_findings(rec: RunRecording, findings: list[Finding],
                             command: Sequence[str]) -> list[Finding]:
    """The script's F4 errors (lint), confirmed by the run, when the run's rules made no F4
    finding (see the module); [] otherwise."""
    if any(f.cls == "F4" for f in findings):
        return []  # the run judged its schedule itself (a warning or note is its own view)
    confirmed = _confirmed(rec)
    if confirmed is None:
        return []
    said = _lint_hit(command, lambda f: f.cls == "F4")
    if said is None:
        return []
    k, n, rates = confirmed
    shows = (f"the run shows what that rests on: the optimizer stepped once per {k} backward "
             f"passes ({n} steps)")
    if said[1].code in _WINDOW_ONLY_CODES:  # a coefficient's or an average's, not the rate's
        return [_claim("F4", 0, said, shows)]
    if len(rates) < 2:
        return []
    return [_claim("F4", 0, said, f"{shows} and the learning rate changed during the run "
                                  f"({rates[0]:.4g} at the first step, {rates[-1]:.4g} at the last)")]


def scale_source_findings(rec: RunRecording, findings: list[Finding],
                          command: Sequence[str]) -> list[Finding]:
    """The script's LOSS_SCALE errors that only the source shows (a Trainer told its
    per-micro-batch mean is already scaled for accumulation: lint), when the run shows the
    windows they rest on (K >= 2 backwards per step) and its rules made no LOSS_SCALE error."""
    return _on_windows(rec, findings, command, "LOSS_SCALE", _SCALE_CODES)


def _on_windows(rec: RunRecording, findings: list[Finding], command: Sequence[str], cls: str,
                codes: tuple[str, ...], also: str = "") -> list[Finding]:
    """Lint's ``cls`` error of one of ``codes``, kept when the run's windows are K >= 2
    backwards and its rules made no ``cls`` error; [] otherwise."""
    if any(f.cls == cls and f.severity == "error" for f in findings):
        return []
    confirmed = _confirmed(rec)
    if confirmed is None:
        return []
    said = _lint_hit(command, lambda f: f.code in codes)
    if said is None:
        return []
    k, n, _ = confirmed
    return [_claim(cls, 0, said,
                   f"the run shows what that rests on: the optimizer stepped once per {k} "
                   f"backward passes ({n} steps){also}")]


def resume_source_findings(rec: RunRecording, findings: list[Finding],
                           command: Sequence[str]) -> list[Finding]:
    """The script's F13 resume errors (lint), when the run resumed from a checkpoint (an
    optimizer ``load_state_dict``) and its rules made no F13 error; [] otherwise."""
    if any(f.cls == "F13" and f.severity == "error" for f in findings):
        return []
    loads = sorted({int(s) for e in rec.end.values() for s in e.get("state_loads") or []})
    if not loads:
        return []
    said = _lint_hit(command, lambda f: f.code in _RESUME_CODES)
    if said is None:
        return []
    at = ", ".join(f"step {s + 1}" for s in loads[:4])
    return [_claim("F13", 0, said,
                   f"the run resumed: an optimizer's state was loaded before optimizer {at}")]


def clip_source_findings(rec: RunRecording, findings: list[Finding],
                         command: Sequence[str]) -> list[Finding]:
    """F9 when lint warns that the script's clip setting never reaches the Trainer and the
    run shows a norm clip shrinking updates; [] otherwise (or beside an F9 error of the
    run's own)."""
    if any(f.cls == "F9" and f.severity == "error" for f in findings):
        return []
    shrunk = sorted((int(s.get("step", 0)), float(c["clip"])) for ss in rec.steps.values()
                    for s in ss if isinstance(c := s.get("conservation"), dict)
                    and isinstance(c.get("clip"), (int, float)) and float(c["clip"]) < 1 - 1e-6)
    if not shrunk:
        return []
    said = _lint_hit(command, lambda f: f.code in _CLIP_CODES, levels=("error", "warning"))
    if said is None:
        return []
    steps = sorted({s for s, _ in shrunk})
    return [_claim("F9", steps[0], said,
                   f"the run shows that clip acting: a norm clip shrank the update of "
                   f"{len(steps)} optimizer step(s), by a factor down to "
                   f"{min(c for _, c in shrunk):.3g} (first at optimizer step {steps[0] + 1})",
                   title="the script's clip setting never reaches the Trainer: its default "
                         "clip at 1.0 shrank updates")]


def world_source_findings(rec: RunRecording, findings: list[Finding],
                          command: Sequence[str]) -> list[Finding]:
    """F1 when lint warns that a DeepSpeed train batch leaves out the number of processes and
    the run was DeepSpeed on several ranks; [] otherwise (or beside an F1 error of the run's
    own)."""
    if rec.world < 2 or any(f.cls == "F1" and f.severity == "error" for f in findings):
        return []
    if not any(e.get("engine") == "deepspeed" for e in rec.engine.values()):
        return []
    said = _lint_hit(command, lambda f: f.code in _WORLD_CODES, levels=("error", "warning"))
    if said is None:
        return []
    windows = sorted({int(s.get("backwards", 0) or 0) for ss in rec.steps.values() for s in ss
                      if s.get("applied", True)})
    seen = "" if not windows else (
        f"; its optimizer stepped after {' or '.join(map(str, windows[:4]))} backward pass(es)")
    return [_claim("F1", 0, said,
                   f"the run had {rec.world} processes, so DeepSpeed's accumulation was 1/"
                   f"{rec.world} of the micro-batches meant{seen}",
                   title=f"DeepSpeed's train batch leaves out the {rec.world} processes: each "
                         f"rank stepped after 1/{rec.world} of the window")]


def hook_clip_source_findings(rec: RunRecording, findings: list[Finding],
                              command: Sequence[str]) -> list[Finding]:
    """The script's F8 errors about a clip in a gradient hook (lint), when the run's windows
    are K >= 2 backwards and its rules made no F8 error; [] otherwise."""
    return _on_windows(rec, findings, command, "F8", _HOOK_CLIP_CODES,
                       ", so the hook acted on each of them")


def counter_source_findings(rec: RunRecording, findings: list[Finding],
                            command: Sequence[str]) -> list[Finding]:
    """F13 when lint warns that a Trainer override counts its own windows and the run shows
    a window shorter than K before its last step (after it, the override's counter is off
    the Trainer's boundaries); [] otherwise (or beside an F13 error of the run's own)."""
    if any(f.cls == "F13" and f.severity == "error" for f in findings):
        return []
    confirmed = _confirmed(rec)
    if confirmed is None:
        return []
    k = confirmed[0]
    short: list[tuple[int, int]] = []
    for r in rec.ranks:
        steps = [s for s in rec.steps.get(r, []) if s.get("applied", True)]
        short += [(int(s.get("step", i)), int(s.get("backwards", 0) or 0))
                  for i, s in enumerate(steps[:-1]) if 0 < int(s.get("backwards", 0) or 0) < k]
        break  # (every rank runs the Trainer's windows alike)
    if not short:
        return []
    said = _lint_hit(command, lambda f: f.code in _COUNTER_CODES, levels=("error", "warning"))
    if said is None:
        return []
    step, n = short[0]
    return [_claim("F13", step, said,
                   f"the run shows such a window: optimizer step {step + 1} came after {n} "
                   f"backward pass(es) where the others took {k}, so the counter's test left "
                   "the Trainer's boundaries from there",
                   title="the override's own window counter leaves the Trainer's windows "
                         "after a short one")]
