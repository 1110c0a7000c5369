"""``accumguard watch`` as a library: run a command with every rank observed, and judge
the records it leaves. The CLI (:mod:`accumguard.cli.watch`) parses arguments and prints;
what a report holds, and the exit-code policy, are decided here, once.

>>> result = accumguard.watch(["torchrun", "--nproc-per-node", "2", "train.py"],
...                           accumulation_steps=4)              # doctest: +SKIP
>>> [f.cls for f in result.errors]                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accumguard.observe._records import Finding, RunRecording, watch_dict
from accumguard.watch._recording import OBSERVE_STEPS

__all__ = ["EXIT_ACCUMGUARD_FAILED", "JSON_SCHEMA_VERSION", "WatchResult", "judge",
           "run_in_group", "watch"]

#: accumguard's own failure: observation switched itself off on a rank; the run was unchanged.
EXIT_ACCUMGUARD_FAILED = 3
#: the ``--json`` report's layout (docs/watch.md "JSON report"): bumped when a field
#: changes meaning or goes away; new fields may appear without a bump
JSON_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class WatchResult:
    """What ``watch`` found. ``report`` is the JSON report (docs/watch.md, "JSON report");
    ``exit_code`` the CLI's: 1 when an error finding exists, else the command's own code
    when it failed, else :data:`EXIT_ACCUMGUARD_FAILED` when accumguard failed on a rank,
    else 0."""

    report: dict[str, Any]
    findings: list[Finding]
    exit_code: int

    @property
    def errors(self) -> list[Finding]:
        """The findings that claim the update differs from the large batch's."""
        return [f for f in self.findings if f.severity == "error"]

    @property
    def checked(self) -> bool:
        """False when no optimizer step with a backward pass was observed: then the absence
        of findings says nothing about the run."""
        return bool(self.report.get("checked"))


def watch(command: Sequence[str], *, accumulation_steps: int | None = None, every: int = 1,
          keep: str | os.PathLike[str] | None = None,
          out: str | os.PathLike[str] | None = None,
          observe_steps: int | None = OBSERVE_STEPS) -> WatchResult:
    """Run ``command`` (``python x.py``, ``torchrun ...``, ``deepspeed ...``, ``accelerate
    launch ...``) unmodified, with accumguard's observation in every Python process it
    starts, and judge what they recorded. ``keep``: keep the rank records in that directory
    (cleared first); ``out``: a directory shared by the watches of several nodes (never
    cleared; see docs/multinode.md). ``observe_steps``: each rank is observed for that many
    optimizer steps (longer while its first epoch's end is in reach), then runs on with
    nothing of accumguard in it; None: every step. The command's output passes through."""
    from accumguard.watch._recording import observed_env

    if not command:
        raise ValueError("watch: no command given (e.g. ['python', 'train.py'])")
    if keep is not None and out is not None:
        raise ValueError("watch: give keep or out, not both (out: several nodes share it)")
    if accumulation_steps is not None and accumulation_steps < 1:
        raise ValueError(f"watch: accumulation_steps must be >= 1, got {accumulation_steps}")
    tmp = None
    watch_id = None
    if out is not None:
        # shared by the watches of several nodes: nothing is removed (another node's ranks
        # may be writing); this watch reads back only the files its own command wrote
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
        watch_id = uuid.uuid4().hex
    elif keep is not None:
        out_dir = Path(keep)
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("rank-*.jsonl"):
            old.unlink()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="accumguard-watch-")
        out_dir = Path(tmp.name)
    try:
        env = observed_env(None, out_dir, every=every, watch_id=watch_id,
                           observe_steps=observe_steps)
        code, signalled = run_in_group(command, env)
        return judge(out_dir, command=command, accumulation_steps=accumulation_steps,
                     code=code, signalled=signalled, watch_id=watch_id)
    finally:
        if tmp is not None:
            tmp.cleanup()


def judge(out_dir: str | os.PathLike[str], *, command: Sequence[str] = (),
          accumulation_steps: int | None = None, code: int = 0, signalled: str | None = None,
          watch_id: str | None = None, merged: bool = False) -> WatchResult:
    """Judge the rank records in ``out_dir`` (left by a watched command) as ``watch`` does.

    ``command``: what was run (K declared in its source is read from it); ``code`` and
    ``signalled``: how it ended; ``watch_id``: read only that watch's files of a
    directory shared by several nodes; ``merged``: the whole job's records (``watch
    --report``), the command then read from rank 0's start record.

    Never raises for accumguard's own bug: judging that fails outside the rules (which
    :func:`~accumguard.observe.rules.analyze` isolates one by one) gives a report that
    says so, with nothing judged and the traceback, and the command's own exit code (or
    :data:`EXIT_ACCUMGUARD_FAILED`).
    """
    try:
        return _judge(out_dir, command=command, accumulation_steps=accumulation_steps,
                      code=code, signalled=signalled, watch_id=watch_id, merged=merged)
    except Exception:  # noqa: BLE001 - accumguard's own bug: reported, never raised
        return _judge_failed(command, code, signalled, traceback.format_exc())


def _judge_failed(command: Sequence[str], code: int, signalled: str | None,
                  tb: str) -> WatchResult:
    """The report of a judge that failed as a whole: it must not read as a pass."""
    lines = tb.rstrip().splitlines()
    failed = [f"accumguard FAILED while judging the recording (its own error, not your "
              f"script's): {lines[-1] if lines else 'unknown error'}; nothing was judged (no "
              "finding means nothing about this run); the run itself went on unchanged. "
              "Please report this with the traceback below",
              *("  " + t for t in lines[-12:])]
    report: dict[str, Any] = {
        "schema_version": JSON_SCHEMA_VERSION, "tool": "accumguard watch",
        "accumguard_failed": failed, "command": list(command), "exit_code": code,
        "signal": signalled, "ranks": [], "world_size": 0, "ranks_missing": [],
        "checked": False, "accumulation_steps": None, "accumulation_steps_source": None,
        "script_declaration": None, "numbering": None, "engine": {}, "findings": [],
        "problems": [], "steps": [], "steps_in_backward": 0, "epochs": []}
    return WatchResult(report=report, findings=[],
                       exit_code=code if code != 0 else EXIT_ACCUMGUARD_FAILED)


def _judge(out_dir: str | os.PathLike[str], *, command: Sequence[str],
           accumulation_steps: int | None, code: int, signalled: str | None,
           watch_id: str | None, merged: bool) -> WatchResult:
    from accumguard.observe._isolated import Isolated
    from accumguard.watch._declared import declared_k
    from accumguard.watch._findings import (
        NUMBERING,
        analyze,
        collective_positions,
        load_recordings,
        merge_ranks,
    )
    from accumguard.watch._source_claims import (
        clip_source_findings,
        counter_source_findings,
        hook_clip_source_findings,
        resume_source_findings,
        scale_source_findings,
        schedule_source_findings,
        world_source_findings,
    )

    out_dir = Path(out_dir)
    rec = load_recordings(out_dir, watch_id=watch_id)
    given = list(command)
    if merged:
        command = _recorded_argv(out_dir)
    script = None
    if not accumulation_steps:
        script = declared_k(list(command), world=max(1, rec.world))
    findings, k, k_source = analyze(rec, k_flag=accumulation_steps, script=script)
    if not accumulation_steps:
        # (each on its own: one that raises is accumguard's failure, the others still report)
        rule = Isolated(rec)
        none: list[Finding] = []
        findings += rule("dropped_option_findings", _dropped_option_findings, rec, findings,
                         command, default=none)
        findings += rule("schedule_source_findings", schedule_source_findings, rec, findings,
                         command, default=none)
        findings += rule("resume_source_findings", resume_source_findings, rec, findings,
                         command, default=none)
        findings += rule("scale_source_findings", scale_source_findings, rec, findings,
                         command, default=none)
        findings += rule("clip_source_findings", clip_source_findings, rec, findings,
                         command, default=none)
        findings += rule("world_source_findings", world_source_findings, rec, findings,
                         command, default=none)
        findings += rule("hook_clip_source_findings", hook_clip_source_findings, rec, findings,
                         command, default=none)
        findings += rule("counter_source_findings", counter_source_findings, rec, findings,
                         command, default=none)
    findings = merge_ranks(findings, rec.ranks)  # what every rank saw alike: one finding
    steps = {r: s for r, s in rec.steps.items()}
    n_steps = max((len(s) for s in steps.values()), default=0)
    errors = [f for f in findings if f.severity == "error"]
    problems = []
    if signalled:
        problems.append(f"the command was killed by {signalled} (exit code {code})")
    elif code != 0:
        problems.append(f"the command exited with code {code}")
    if signalled or code != 0:
        problems += collective_positions(rec)
    backwards = sum(int(s.get("backwards", 0)) for ss in rec.steps.values() for s in ss)
    hooked = max(rec.in_backward.values(), default=0)
    if rec.failures:
        pass  # what was (not) checked is said by the failure lines, first
    elif hooked:  # steps set apart by the loader: the report must not read as a pass
        problems.append(_in_backward_line(hooked, n_steps, any(
            f.cls == "F1" and "inside each of the" in f.evidence for f in findings)))
    elif n_steps == 0:
        backwards = sum(int(e.get("backwards_total", 0)) for e in rec.end.values())
        seen = (f"{backwards} backward passes" if backwards else "no backward pass either"
                + ("" if signalled or code != 0 else
                   ": is this a training command that uses torch?"))
        why = (f"the command was killed by {signalled} before any optimizer step" if signalled
               else f"the command exited with code {code} before any optimizer step"
               if code != 0 else "the command finished (exit code 0) without an optimizer step")
        # first, in place of the bare exit code: an empty report must not read as a pass
        never = any(f.cls == "F14" and f.step is None for f in errors)
        problems = [f"no window was judged: {why} ({seen}); the F14 error says why"
                    if never else
                    f"nothing was checked: {why}; no optimizer step was observed ({seen})",
                    *(p for p in problems if not p.startswith("the command "))]
    elif backwards == 0:
        problems.append(f"nothing was checked: {n_steps} optimizer step(s) but no backward pass "
                        "before any of them (gradients made another way, e.g. "
                        "torch.autograd.grad into .grad, are not followed); the absence of "
                        "findings below says nothing about this run")
    problems += _coverage_lines(rec, out_dir=out_dir, shared=watch_id is not None,
                                merged=merged)
    failed = _failure_lines(rec)
    report = {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": "accumguard watch",
        "accumguard_failed": failed,
        "command": given,
        "exit_code": code,
        "signal": signalled,
        "ranks": rec.ranks,
        "world_size": rec.world,
        "ranks_missing": sorted(set(range(rec.world)) - set(rec.ranks)) if rec.ranks else [],
        "ranks_without_steps": sorted(idle_ranks(rec)),
        "checked": n_steps > 0 and backwards > 0,
        "accumulation_steps": k,
        "accumulation_steps_source": k_source,
        "script_declaration": None if script is None else {
            "name": script.name, "value": script.value, "path": script.path,
            "line": script.line, "how": script.how, "divides_loss": script.divides_loss},
        "numbering": NUMBERING,
        "engine": {str(r): v for r, v in rec.engine.items()},
        "findings": [watch_dict(f) for f in findings],
        "problems": problems,
        "steps": _summary(rec),
        # the first rank's optimizer steps that ran inside a backward pass (not judged)
        "steps_in_backward": rec.in_backward.get(min(rec.ranks, default=0), 0),
        "epochs": _epochs(rec),
    }
    if errors:
        exit_code = 1
    elif code == 0 and failed:
        exit_code = EXIT_ACCUMGUARD_FAILED
    else:
        exit_code = code
    return WatchResult(report=report, findings=findings, exit_code=exit_code)


def _in_backward_line(hooked: int, n_steps: int, every_pass: bool = False) -> str:
    """What the report says about optimizer steps that ran inside a backward pass (an
    optimizer stepped from a gradient hook): not judged but for ``every_pass`` (F1: a step
    in every backward pass while K > 1 is declared), and whether anything else was."""
    what = (f"{hooked} optimizer step(s) ran inside a backward pass (an optimizer stepped "
            "from a gradient hook, e.g. register_post_accumulate_grad_hook: an optimizer in "
            "backward); watch does not follow the windows of such steps and judged none "
            "of them")
    if every_pass:
        what = what.replace("judged none of them", "judged only that one ran in every "
                            "backward pass (F1 below)")
        return (f"otherwise not checked: {what}" if n_steps == 0 else
                f"otherwise not checked: {what}; the other findings are about the other "
                f"{n_steps} step(s)")
    if n_steps == 0:
        return (f"nothing was checked: {what}; the absence of findings below says nothing "
                "about this run")
    return f"not checked: {what}; the findings below are about the other {n_steps} step(s)"


def run_in_group(command: Sequence[str], env: dict[str, str]) -> tuple[int, str | None]:
    """Run the watched command (see :func:`accumguard.runtime._child.run_group`): its exit
    code and the name of the signal that ended it, if any."""
    from accumguard.runtime._child import run_group

    end = run_group(command, env)
    if end.start_error:
        print(f"accumguard watch: error: cannot start {command[0]!r}: {end.start_error}",
              file=sys.stderr)
        return 127, None
    return end.code, end.signal


def _dropped_option_findings(rec: RunRecording, findings: list[Finding],
                             command: Sequence[str]) -> list[Finding]:
    """F1 when every optimizer step of every rank came after a single backward pass and the
    script's accumulation setting never reaches what accumulates (lint's AG187, AG191,
    AG322, AG335 or AG347, at error level): the K the command asks for is not the K the run used."""
    from accumguard.observe._records import _mk
    from accumguard.watch._declared import dropped_accumulation_option

    if any(f.cls == "F1" and f.severity == "error" for f in findings):
        return []
    steps = [s for ss in rec.steps.values() for s in ss]
    if len(steps) < 2 or any(int(s.get("backwards", 0) or 0) != 1 for s in steps):
        return []
    said = dropped_accumulation_option(list(command))
    if said is None:
        return []
    text, hit = said
    return [_mk("F1", "error", None, 0, None,
                f"every optimizer step of the run ({len(steps)} over its ranks) came after a "
                f"single backward pass, and "
                + ("the script divides its accumulation count down to 1" if hit.code == "AG335"
                   else "the script's accumulation setting does not reach what accumulates")
                + f" ({text})",
                title_=("the accumulation steps divided by the world size down to 1: the "
                        "optimizer steps on every micro-batch" if hit.code == "AG335" else
                        "the accumulation setting never reaches the loop: the optimizer steps "
                        "on every micro-batch"),
                fix=hit.fix if hit.code in ("AG322", "AG335") else
                "Name the option as the config field the loop reads (or pass the field "
                "through), so the K the command asks for is the K the loop uses.")]


def _recorded_argv(out_dir: Path) -> list[str]:
    """The command a job's rank 0 ran (``--report`` has no command line of its own; the
    script's declared K is read from it)."""
    for path in sorted(out_dir.glob("rank-*.jsonl")):
        with contextlib.suppress(OSError, ValueError), path.open(encoding="utf-8") as fh:
            first = json.loads(fh.readline() or "{}")
            if first.get("kind") == "start" and first.get("argv"):
                return [sys.executable, *[str(a) for a in first["argv"]]]
    return []


def idle_ranks(rec: Any) -> dict[int, int]:
    """Ranks that ran backward passes and no optimizer step while others stepped (a
    parameter server's workers), each with its backward count; {} when none."""
    if not any(rec.steps.get(r) for r in rec.ranks):
        return {}
    idle = {r: int((rec.end.get(r) or {}).get("backwards_total") or 0) for r in rec.ranks
            if not rec.steps.get(r)}
    return {r: n for r, n in idle.items() if n}


def _coverage_lines(rec: Any, *, out_dir: Path, shared: bool, merged: bool) -> list[str]:
    """Say which ranks of the job this report holds: a watch on one node of several sees
    only that node's ranks, and the rules that compare ranks then covered only those."""
    lines = []
    seen = rec.ranks
    ended = {r: int(e.get("steps", 0) or 0) for r, e in rec.end.items()
             if e.get("reason") == "observed"}
    if ended:
        counts = sorted(set(ended.values()))
        which = "each rank" if set(ended) == set(seen) else \
            "rank(s) " + ", ".join(map(str, sorted(ended)))
        lines.append(f"watch observed the first {'/'.join(map(str, counts))} optimizer steps of "
                     f"{which}, then let the run go on with nothing of accumguard in it "
                     "(--observe-steps; longer while the end of a first DataLoader pass was in "
                     "reach): the findings are about those steps; a bug that shows only later "
                     "(a later epoch's end, a change of phase) needs --observe-steps 0 (every "
                     "step)")
        new = {r: int(t.get("new_optimizer_steps", 0) or 0) for r, t in rec.tail.items()}
        if any(new.values()):
            lines.append(f"after the observed steps, optimizers watch had not seen step made "
                         f"{max(new.values())} optimizer step(s) on rank(s) "
                         f"{', '.join(str(r) for r in sorted(new) if new[r])} (a new phase: a "
                         "second stage, a model rebuilt to resume): none of them was observed; "
                         "--observe-steps 0 checks them")
    stepped = {r for r in seen if rec.steps.get(r)}
    idle = idle_ranks(rec)
    if idle:
        lines.append(f"rank(s) {', '.join(map(str, sorted(idle)))} ran "
                     f"{'/'.join(str(idle[r]) for r in sorted(idle))} backward pass(es) and no "
                     f"optimizer step while rank(s) {', '.join(map(str, sorted(stepped)))} "
                     "stepped (their gradients reach the stepping ranks another way, e.g. "
                     "`dist.reduce` onto a parameter server): their windows were not judged, "
                     "and what the stepping ranks received from them was not compared with "
                     "what they sent")
    if getattr(rec, "outside_steps", 0):
        lines.append(f"{rec.outside_steps} optimizer step(s) were made by process(es) of one "
                     f"outside the {rec.world}-rank job (the script's process that started the "
                     "ranks, or a subprocess beside them: a single-process reference or an "
                     "evaluation): they are not a rank's and were not judged")
    if len(rec.run_ids - {None}) > 1:
        lines.append(f"the records in {str(out_dir)} belong to {len(rec.run_ids - {None})} "
                     "different jobs (torchrun run ids "
                     f"{', '.join(sorted(str(r) for r in rec.run_ids - {None}))}): the report "
                     "mixes them; give each job its own --out directory")
    if seen and rec.world > len(seen):
        missing = sorted(set(range(rec.world)) - set(seen))
        head = (f"the job has {rec.world} ranks; this report holds the records of rank(s) "
                f"{', '.join(map(str, seen))} only (missing: {', '.join(map(str, missing))}): "
                "the checks that compare ranks (gradients agree across ranks, loss weights "
                "summed over ranks, F6/F10) covered only these ranks")
        if merged:
            lines.append(head + "; did every node's watch write to this directory, and had "
                                "every node finished?")
        elif shared:
            lines.append(head + f"; once every node has finished, `accumguard watch --report "
                                f"{out_dir}` judges the whole job")
        else:
            lines.append(head + "; on a job of several nodes, run every node's watch with "
                                "--out SHARED_DIR and then `accumguard watch --report "
                                "SHARED_DIR`")
    return lines


def _epochs(rec: Any) -> list[dict[str, Any]]:
    """Per pass over a DataLoader on the first rank: micro-batches, optimizer steps,
    scheduler steps, and the window sizes (empty when no DataLoader pass was seen)."""
    from accumguard.observe._epochs import epochs

    rank = min(rec.steps, default=0)
    pending = int(rec.end.get(rank, {}).get("pending_backwards", 0) or 0)
    steps = rec.steps.get(rank, [])
    lanes = sorted({s.get("optimizer_index") for s in steps} - {None})
    if len(lanes) < 2:
        return [e.as_dict() for e in epochs(steps, rec.schedulers.get(rank, []), pending)]
    # several optimizers over disjoint parameters: each one's step records hold the
    # backwards of its own window, so summing every record counts a micro-batch once per
    # optimizer; one optimizer's windows cover every backward once (its steps are counted,
    # with the shared window's before the optimizers were told apart, index None)
    first = [s for s in steps if s.get("optimizer_index") in (None, lanes[0])]
    name = next((str(s.get("optimizer")) for s in first if s.get("optimizer")), "optimizer")
    # a scheduler record made at another optimizer's step is placed at this one's step
    # before it (the same window when the optimizers step together)
    ids = [int(s.get("step", 0)) for s in first]
    scheds = [{**e, "step": max((i for i in ids if i <= int(e.get("step", 0))),
                                default=ids[0] if ids else 0)}
              for e in rec.schedulers.get(rank, [])]
    return [{**e.as_dict(), "optimizer_steps_of": f"optimizer #{lanes[0]} ({name})"}
            for e in epochs(first, scheds, pending)]


def _failure_lines(rec: Any) -> list[str]:
    """What accumguard's own failures mean for this report, first thing the user reads."""
    lines = _observer_failure_lines(rec) if rec.failures else []
    judged = getattr(rec, "judge_failures", [])
    if judged:
        names = sorted({str(f.get("rule")) for f in judged})
        first = judged[0]
        lines.append(f"accumguard FAILED while judging the recording (its own error, not your "
                     f"script's): the rule(s) {', '.join(names)} raised ({first.get('error')}); "
                     "what they check was not judged (no finding from them means nothing), "
                     "every other rule ran and its findings are below. Please report this "
                     "with the traceback below")
        tb = str(first.get("traceback") or "").rstrip().splitlines()
        lines += ["  " + t for t in tb[-12:]]
    return lines


def _observer_failure_lines(rec: Any) -> list[str]:
    lines = []
    for rank in sorted(rec.failures):
        f = rec.failures[rank]
        lines.append(f"accumguard FAILED on rank {rank} (its own error, not your script's): "
                     f"{f.get('error')} in {f.get('where')}, after {f.get('step')} optimizer "
                     "step(s); observation was switched off there and the run went on "
                     "unchanged")
    cut = rec.observed_steps or 0
    checked = (f"only the first {cut} optimizer step(s) were checked; nothing after them was "
               "(no finding about them means nothing)" if cut else
               "no optimizer step was checked (no finding means nothing about this run)")
    lines.append(f"{checked}. Please report this with the traceback below (kept with "
                 "--keep DIR in rank-R.jsonl)")
    first = rec.failures[min(rec.failures)]
    tb = str(first.get("traceback") or "").rstrip().splitlines()
    lines += ["  " + t for t in tb[-12:]]
    return lines


def _summary(rec: Any) -> list[dict[str, Any]]:
    rows = []
    rank0 = rec.steps.get(min(rec.steps), []) if rec.steps else []
    for s in rank0:
        cons = s.get("conservation") or {}
        mixed = _ranks_mixed(s, cons)
        # a clip after the last backward (clip_grad_value_ is not a scale) changes what the
        # optimizer receives by design: its distance from the backwards is no error
        clipped = (not mixed and bool(cons) and bool(cons.get("ok", False))
                   and int(s.get("clips", 0) or 0) > 0 and float(cons.get("received", 0.0)) > 1e-3)
        rows.append({"step": int(s["step"]) + 1, "backwards": s["backwards"], "applied": s["applied"],
                     "optimizer": s.get("optimizer"), "optimizer_index": s.get("optimizer_index"),
                     "scheduler_steps": s.get("scheduler_steps", 0),
                     "grad_collective_rounds": s.get("reduction_rounds", 0),
                     "conservation_error": cons.get("received") if cons and not mixed
                     and not clipped else None,
                     "conservation_not_judged": "the script's own collectives mixed other "
                     "ranks' gradients into .grad" if mixed else
                     "clipped after the window's last backward: the optimizer received the "
                     "clipped gradient, as it should" if clipped else None,
                     "window_loss": s.get("window_loss")})
    return rows


def _ranks_mixed(step: dict[str, Any], cons: dict[str, Any]) -> bool:
    """A window whose .grad the script itself all-reduced on a model no engine averages
    (a hand-written data parallelism): what the optimizer received holds the other ranks'
    gradients, so its distance from this rank's backwards is not an error (nor a verdict)."""
    return (bool(cons) and int(step.get("reductions", 0)) > 0
            and step.get("engine", "local") == "local" and bool(cons.get("ok", False))
            and float(cons.get("received", 0.0)) > 1e-3)  # a wipe (F2/F3) keeps its number
