"""What a run's recording, a resolved K and a window of step records are, and how a rule
makes its finding (the one :class:`~accumguard.core.findings.Finding`, re-exported here)
and how ``watch`` writes it: the types and helpers every per-window rule of
:mod:`accumguard.observe.rules` and :mod:`._weight_rules` shares (pure Python; :mod:`.rules`
re-exports the public names)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TypeAlias, TypeVar

from accumguard.core.findings import Finding, Severity
from accumguard.core.taxonomy import fix_for, title
from accumguard.core.window import StepRecord

__all__ = ["NUMBERING", "DeclaredK", "Finding", "engine_summed", "first_per_optimizer", "JsonObject", "KResolution", "RunRecording",
           "Severity", "StepWindow", "load_recordings", "lines_by_step", "step_record", "watch_dict",
           "windows"]

W = TypeVar("W")

#: One JSON object as a recording holds it (a ``rank-<R>.jsonl`` line, or the engine/end
#: record's nested objects): its values are whatever the writer's version put there, so
#: the rules read the step lines through :class:`StepWindow` and only the other kinds
#: (start, scheduler, engine, end, internal_error) and a step line's ``comm`` ledger raw.
JsonObject: TypeAlias = dict[str, Any]

#: One numbering in every output of ``watch`` and ``invariance`` (findings, tables, JSON):
#: optimizer steps and micro-steps count from 1. (The raw recording counts from 0.)
NUMBERING = "1-based: step 1 is the first optimizer step, micro-step 1 the first backward " \
            "of its window"


def watch_dict(f: Finding) -> dict[str, str | int | None]:
    """A finding as ``watch --json`` and ``invariance`` write it (schema version 1, the field
    table of docs/watch.md): exactly these eight keys, in this order."""
    return {"cls": f.cls, "severity": f.severity.value, "rank": f.rank, "step": f.step,
            "micro": f.micro, "evidence": f.evidence, "fix": f.fix, "title": f.title}


def _mk(cls: str, severity: str | Severity, rank: int | None, step: int | None, micro: int | None,
        evidence: str, *, title_: str | None = None, fix: str | None = None) -> Finding:
    """``step``/``micro``: the recording's 0-based indices, shown 1-based. ``title_`` and
    ``fix``: this finding's own words (a measured cost in the title) instead of the class's."""
    return Finding(cls, Severity(severity), rank, None if step is None else step + 1,
                   None if micro is None else micro + 1, evidence,
                   fix_for(cls) if fix is None else fix, title(cls) if title_ is None else title_)


def engine_summed(w: StepRecord) -> bool:
    """DeepSpeed's engine stepped this window and every backward of it went through
    ``engine.backward`` (each asked the engine its boundary): the engine sums the window's
    backwards in its buffers as the loss weights recorded them (its own ÷GA, or a dynamic
    loss scale, is in those weights). Not a plain ``loss.backward()`` on a DeepSpeed model,
    whose ÷GA DeepSpeed applies in hooks on the forward's outputs, outside the weights the
    loss record reads."""
    bounds = w.ds_boundaries or []
    return w.source == "deepspeed" and bool(bounds) and all(b is not None for b in bounds)


def first_per_optimizer(windows: Sequence[W], serial: Callable[[W], int | None],
                        judge: Callable[[list[W]], list[Finding]]) -> list[Finding]:
    """``judge`` each optimizer object's windows apart (by ``serial``, numbered in the order
    they first stepped, unnumbered last) and return the first group's findings: a later
    phase's windows (a large-batch reference run after the training, its loss written apart)
    neither prove nor disprove the training's pattern."""
    groups: dict[int | None, list[W]] = {}
    for w in windows:
        groups.setdefault(serial(w), []).append(w)
    for key in sorted(groups, key=lambda x: (x is None, x or 0)):
        found = judge(groups[key])
        if found:
            return found
    return []


def _n(step: int) -> int:
    """A recorded (0-based) step index as the user sees it."""
    return int(step) + 1


@dataclass(frozen=True)
class StepWindow(StepRecord):
    """An applied step's record as the window rules read it: ``window`` is the backward
    passes of its accumulation window (its own, plus those of the no-op steps before it
    that the window went on through), ``backwards_per_micro`` the regular number b > 1 of
    backwards each micro-step ran on one forward (``window`` then counts micro-steps), else
    1. Made by :func:`windows`; never written to a recording."""

    window: int = 0
    backwards_per_micro: int = 1


StepLike: TypeAlias = "StepRecord | Mapping[str, Any]"
_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


def as_record(s: StepLike) -> StepRecord:
    """A step as a typed record: a recording's line read back
    (:meth:`~accumguard.core.window.StepRecord.from_dict`), a record passed as it is."""
    return s if isinstance(s, StepRecord) else StepRecord.from_dict(s)


def records(steps: Sequence[StepLike]) -> list[StepRecord]:
    """:func:`as_record` of every step."""
    return [as_record(s) for s in steps]


def windows(steps: Sequence[StepLike]) -> list[StepWindow]:
    """Public name of :func:`_windows` (applied steps, no-op steps folded in)."""
    return _windows(steps)


def lines_by_step(rec: RunRecording, pick: Callable[[JsonObject], Any]
                  ) -> dict[int, dict[int, Any]]:
    """``{step: {rank: pick(line)}}`` over the step lines of every rank for which ``pick``
    gives something (not None); {} unless every rank of the world recorded steps (a rule
    comparing ranks needs them all)."""
    ranks = [r for r in rec.ranks if rec.steps.get(r)]
    if len(ranks) < 2 or len(ranks) != rec.world:
        return {}
    out: dict[int, dict[int, Any]] = {}
    for r in ranks:
        for line in rec.steps[r]:
            if line.get("kind", "step") == "step" and (got := pick(line)) is not None:
                out.setdefault(int(line["step"]), {})[r] = got
    return out


def _windows(steps: Sequence[StepLike]) -> list[StepWindow]:
    """Applied steps with the backward passes of preceding no-op steps folded in (a step
    whose gradients were all None changes nothing: the window goes on). A step a GradScaler
    skipped (``discarded``) ends its window with nothing carried: it is left out."""
    out = []
    carry = 0
    for s in records(steps):
        if s.discarded:
            carry = 0
            continue
        if not s.applied:
            carry += int(s.backwards)
            continue
        n, per = int(s.backwards) + carry, 1
        if not carry:
            per = _backwards_per_micro(s)
            if per > 1:  # several losses of one forward, each with its own backward
                n = int(s.backwards) // per
        carry = 0
        out.append(StepWindow(**{f: getattr(s, f) for f in _STEP_FIELDS}, window=n,
                              backwards_per_micro=per))
    return out


def window_lines(steps: Sequence[JsonObject]) -> list[JsonObject]:
    """The windows of :func:`_windows` as the step lines they came from, each with its
    ``window`` (and ``backwards_per_micro`` when > 1) added: for the rules that still read
    a step as a dict (:mod:`._term_rules`)."""
    out = []
    carry = 0
    for s in steps:
        if s.get("discarded"):
            carry = 0
            continue
        if not s.get("applied", True):
            carry += int(s["backwards"])
            continue
        w = dict(s)
        w["window"] = int(s["backwards"]) + carry
        if not carry:
            per = _backwards_per_micro(as_record(s))
            if per > 1:
                w["window"] = int(s["backwards"]) // per
                w["backwards_per_micro"] = per
        carry = 0
        out.append(w)
    return out


def _backwards_per_micro(s: StepRecord) -> int:
    """Backward passes per micro-step when every micro-step runs the same number b > 1 of
    them: on one forward (an actor and a critic loss, each with its own backward), the
    watched forwards before each backward being ``[f, 0, .., 0] * K`` with f > 0 and b - 1
    zeros; or in each of two or more ``accumulate()`` blocks (Accelerate's micro-step); or
    around each of DeepSpeed's ``engine.backward`` calls (its micro-step) in the same place. 1
    otherwise (one backward per micro-step, or a pattern that is not regular)."""
    blocks = s.accelerate_blocks
    if blocks and len(blocks) >= 2 and len(set(blocks)) == 1 and blocks[0] >= 2 \
            and sum(blocks) == int(s.backwards):
        # Accelerate counts micro-steps in accumulate() blocks, and every block of the
        # window ran the same b > 1 backwards (two batches per block, or a loop of its own)
        return blocks[0]
    ds = s.ds_boundaries or []
    eng = [i for i, b in enumerate(ds) if b is not None]
    if len(ds) == int(s.backwards) and 2 <= len(eng) < len(ds):
        # DeepSpeed counts its micro-steps in engine.backward calls: plain backwards beside
        # them (a penalty's own .backward()) in the same place of every micro-step
        per = len(ds) // len(eng)
        if per * len(eng) == len(ds) and eng[0] < per \
                and eng == list(range(eng[0], len(ds), per)):
            return per
    fw = s.forwards or []
    if len(fw) < 2 or len(fw) != int(s.backwards) or not fw[0]:
        return 1
    heads = [i for i, f in enumerate(fw) if f]
    per = len(fw) // len(heads)
    if per < 2 or per * len(heads) != len(fw) or heads != list(range(0, len(fw), per)):
        return 1
    return per


class DeclaredK(Protocol):
    """A K the script's source declares (``watch._declared.DeclaredK`` is one)."""

    @property
    def value(self) -> int | None: ...

    @property
    def divides_loss(self) -> bool: ...

    @property
    def where(self) -> str: ...

    def describe(self) -> str: ...


@dataclass
class RunRecording:
    """Everything the ranks wrote: ``steps[rank]`` (step records), engine info, ends, and
    ``failures[rank]``: accumguard's own failure on that rank (observation off from there;
    :func:`~accumguard.observe.rules.load_recordings` keeps only the steps every rank
    observed before the first one, so no rule judges a window half seen)."""

    steps: dict[int, list[JsonObject]] = field(default_factory=dict)
    schedulers: dict[int, list[JsonObject]] = field(default_factory=dict)
    engine: dict[int, JsonObject] = field(default_factory=dict)
    end: dict[int, JsonObject] = field(default_factory=dict)
    failures: dict[int, JsonObject] = field(default_factory=dict)
    #: rules of the judge that raised on this recording (accumguard's own bug): each its
    #: ``rule``, ``error`` and ``traceback``; filled by ``analyze``, reported as a failure
    judge_failures: list[JsonObject] = field(default_factory=list)
    #: per rank, what the run did after observation ended (``observe_steps``), counted
    #: (:mod:`accumguard.observe._tail`): its real end's reason, steps, backwards, passes
    tail: dict[int, JsonObject] = field(default_factory=dict)
    world: int = 1
    #: optimizer steps observed on every rank before accumguard failed (None: no failure)
    observed_steps: int | None = None
    #: recordings left out: processes started by a recorded process (a script's subprocess)
    children: int = 0
    #: optimizer steps of processes of one outside the job: the launcher that started the
    #: ranks of a larger job and trained on its own too, or a process of one recording under a
    #: rank a process of the job recorded under (a single-process reference): not judged
    outside_steps: int = 0
    #: the jobs the rank files belong to (torchrun's run id, else None): more than one means
    #: a shared directory holds several jobs' records
    run_ids: set[str | None] = field(default_factory=set)
    #: the hosts that wrote the rank files
    hosts: set[str] = field(default_factory=set)
    #: per rank, the optimizer steps that ran inside a backward pass (an optimizer stepped
    #: from a gradient hook): set apart from ``steps``, whose windows the rules read; such
    #: a step's window is cut by the backward it ran in (the backward is counted after it)
    in_backward: dict[int, int] = field(default_factory=dict)
    #: per rank, the ordinals of the backward passes such steps ran inside
    in_backward_passes: dict[int, set[int]] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.steps) | set(self.end))


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


def _read_lines(path: Path) -> list[JsonObject]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return out


def load_recordings(out_dir: Path, *, watch_id: str | None = None) -> RunRecording:
    """Read every ``rank-*.jsonl`` of ``out_dir``; with ``watch_id``, only the files written
    by the command of that one ``watch`` (a directory shared by the watches of several
    nodes holds the other nodes' files too)."""
    rec = RunRecording()
    files = [_read_lines(path) for path in sorted(out_dir.glob("rank-*.jsonl"))]
    if watch_id is not None:
        files = [lines for lines in files
                 if lines and lines[0].get("kind") == "start"
                 and lines[0].get("watch_id") in (None, watch_id)]
    # A process started by a recorded process (the script's own subprocess: it inherits the
    # rank's environment, so it records under the same rank) trained on its own: its steps
    # are not the rank's. The start record names each process and its parent. A child that
    # records under another rank than its parent is that rank (Lightning's subprocess
    # launcher starts ranks 1..W-1 from rank 0's process).
    starts = {r.get("pid"): r for lines in files for r in lines[:1]
              if r.get("kind") == "start" and r.get("pid") is not None}
    # A process of one (world 1) that started ranks of a larger job (mp.spawn from the
    # script's main) is the job's launcher: its own training (a single-process reference, an
    # evaluation) is no rank's, whatever rank number it recorded under.
    launchers = {s.get("ppid") for s in starts.values()
                 if _world_of(s) > 1 and s.get("ppid") in starts
                 and _world_of(starts[s.get("ppid")]) == 1}
    # So is a process of one recording under a rank that a process of the job also recorded
    # under (a reference run in a subprocess beside the spawned ranks): two processes cannot
    # both be rank 0 of the job.
    in_job = {int(s.get("rank", 0) or 0) for s in starts.values() if _world_of(s) > 1}
    for lines in files:
        first = lines[0] if lines else {}
        start = first if first.get("kind") == "start" else {}
        ppid = start.get("ppid") if start else None
        parent = starts.get(ppid) if ppid is not None and ppid != start.get("pid") else None
        if parent is not None and start.get("ppid") not in launchers \
                and int(parent.get("rank", 0) or 0) == int(start.get("rank", 0) or 0):
            rec.children += 1
            continue
        if start and (start.get("pid") in launchers or (
                _world_of(start) == 1 and int(start.get("rank", 0) or 0) in in_job)):
            rec.outside_steps += sum(1 for r in lines if r.get("kind") == "step")
            continue
        for r in lines:
            kind = r.get("kind")
            if kind == "start":
                rank = int(r.get("rank", 0))
                rec.world = max(rec.world, int(r.get("world", 1)))
                rec.run_ids.add(r.get("run_id"))
                if r.get("host"):
                    rec.hosts.add(str(r["host"]))
                rec.steps.setdefault(rank, [])
            elif kind == "step" and r.get("in_backward"):
                rec.in_backward[int(r["rank"])] = rec.in_backward.get(int(r["rank"]), 0) + 1
                if isinstance(r.get("backward_pass"), int):
                    rec.in_backward_passes.setdefault(int(r["rank"]), set()).add(
                        r["backward_pass"])
            elif kind == "step":
                rec.steps.setdefault(int(r["rank"]), []).append(r)
            elif kind == "scheduler":
                rec.schedulers.setdefault(rank, []).append(r)
            elif kind == "engine":
                rec.engine[rank] = r
            elif kind == "end":
                rec.end[rank] = r
            elif kind == "tail":
                rec.tail[rank] = r
            elif kind == "internal_error":
                rec.failures.setdefault(int(r.get("rank", rank)), r)
    if rec.failures:
        _truncate_at_failure(rec)
    return rec


def _world_of(start: JsonObject) -> int:
    with contextlib.suppress(TypeError, ValueError):
        return int(start.get("world", 1) or 1)
    return 1


def _truncate_at_failure(rec: RunRecording) -> None:
    """Keep the steps every rank completed before accumguard's first failure: the window in
    flight, and every later one, were not (fully) observed on the failed rank, and the
    cross-rank rules need the same steps from every rank."""
    cut = min((int(f["step"]) if isinstance(f.get("step"), int) else 0)
              for f in rec.failures.values())
    rec.observed_steps = cut
    for rank, steps in rec.steps.items():
        rec.steps[rank] = [s for s in steps if int(s.get("step", 0)) < cut]
    for rank, scheds in rec.schedulers.items():
        rec.schedulers[rank] = [s for s in scheds if int(s.get("step", 0)) < cut]


def step_record(event: StepRecord, rank: int) -> JsonObject:
    """The line of one step record that the rules read (and ``watch`` writes to
    ``rank-<R>.jsonl``): :meth:`~accumguard.core.window.StepRecord.as_dict`."""
    return event.as_dict(rank)
