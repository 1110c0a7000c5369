"""``accumguard demo``: the audit, run on a built-in model across engines and loops.

No download, no network: a tiny causal transformer LM (:class:`accumguard.demo.toy.TinyCausalLM`)
on deterministic synthetic sequences of random lengths (padding labelled with
the ignore index, so valid-token counts differ between micro-batches and
ranks), W = 2 CPU ranks, K = 4. For each engine it audits, in ONE spawn per
engine family, the Accumulator, a correct hand-written loop and the broken
loops of :func:`accumguard.demo.loops.catalog`, then prints a table, writes a JSON
report and a plot of each loop's update error per step.

Then the story (:mod:`accumguard.demo.story`, ``story=False`` / ``--no-story`` to
skip): the seed report's "ZeRO-2 with accumulation trains worse", trained for
32 steps and plotted. The output ends with three lines per failure class seen
(:mod:`accumguard.demo.console`): what was wrong, by how much, the fix.

The demo's verdict is about *expectations*: the Accumulator and the correct
loops must pass, every broken loop must fail **and** be diagnosed as its
class, and in the story the hand loop must end worse than the large batch while
the correct runs end within 1e-3 of it. Exit code 0 when all of that holds, 1
otherwise.

Size (~600 lines): the demo's orchestration (matrix, story and report writing); printing and plots already live in console.py and plots.py. Known debt: the JSON writer could move out.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from accumguard.core.errors import ConfigError
from accumguard.demo.console import STORY_HEADERS, Output, story_lines, summary_lines
from accumguard.demo.loops import ENGINES, CatalogLoop, catalog, engine_available
from accumguard.demo.records import DemoRow
from accumguard.demo.toy import (
    TinyCausalLM,
    TokenMLP,
    count_tokens,
    make_lm_batches,
    make_rank_batches,
    token_loss,
)
from accumguard.verify.contract import AuditSetup

if TYPE_CHECKING:  # pragma: no cover - types only
    from accumguard.demo.story import StoryResult
    from accumguard.verify.report import AuditReport

__all__ = ["DemoOptions", "DemoRow", "DemoResult", "demo_setup", "run_demo", "parse_engines"]

JSON_VERSION = 1
QUICK_ENGINES = ("ddp", "zero1")


# ----------------------------------------------------------------------------- the setup
def _build_model(kind: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "mlp":
        return TokenMLP()
    return TinyCausalLM(vocab=64, dim=64, layers=2, heads=4, hidden=256, max_len=16)


def _sgd(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    # SGD with momentum, not Adam: Adam is invariant to a uniform gradient scale, so it
    # would hide scale bugs that a real run with SGD (or a tuned LR) pays for.
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def _decay_factor(step: int, rate: float) -> float:
    return 1.0 / (1.0 + rate * step)


def _decay(opt: torch.optim.Optimizer, rate: float) -> torch.optim.lr_scheduler.LambdaLR:
    # A decaying LR, starting at full size: a scheduler stepped K× too often (F4) shows at
    # once, and the first update is large enough that fp32 weights resolve it (a warmup's
    # tiny first step on weights of size 1 would measure fp32 rounding, not the loop).
    return torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(_decay_factor, rate=rate))


def _rank_batches(rank: int, world: int, *, kind: str, seed: int,
                  micro_batches: int) -> list[dict[str, torch.Tensor]]:
    if kind == "mlp":
        return make_rank_batches(seed=seed, world_size=world, micro_batches=micro_batches)[rank]
    return make_lm_batches(seed=seed, world_size=world, micro_batches=micro_batches,
                           seq_len=16, vocab=64)[rank]


def demo_setup(*, model: str = "lm", steps: int = 3, accumulation_steps: int = 4,
               seed: int = 0) -> AuditSetup:
    """The demo's training setup: ``steps`` optimizer steps of K micro-batches per rank.

    ``model="lm"``: the tiny causal transformer (0.1 M parameters) on synthetic
    sequences; ``"mlp"``: the smaller :class:`~accumguard.demo.toy.TokenMLP` (for tests).
    SGD with momentum and a decaying LR schedule (so a scheduler bug shows).
    """
    if model not in ("lm", "mlp"):
        raise ConfigError(f"model ({model!r}) must be 'lm' (tiny transformer) or 'mlp'")
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps ({steps!r}) must be a positive int (optimizer steps)")
    return AuditSetup(
        build_model=functools.partial(_build_model, model, seed),
        make_optimizer=functools.partial(_sgd, lr=1.0 if model == "lm" else 0.5),
        make_scheduler=functools.partial(_decay, rate=0.3),
        rank_batches=functools.partial(_rank_batches, kind=model, seed=seed,
                                       micro_batches=steps * accumulation_steps),
        loss_fn=token_loss,
        count_fn=count_tokens,
        accumulation_steps=accumulation_steps,
    )


# ----------------------------------------------------------------------------- results
@dataclass
class DemoResult:
    rows: list[DemoRow]
    reports: dict[str, Any]
    notes: list[str]
    elapsed_s: float
    out_dir: Path
    json_path: Path | None = None
    plot_path: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    story: StoryResult | None = None
    story_plot_path: Path | None = None

    @property
    def ok(self) -> bool:
        return all(r.as_expected is not False for r in self.rows) and \
            any(r.as_expected for r in self.rows) and \
            (self.story is None or self.story.ok)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """What ``accumguard demo`` runs. ``steps``: optimizer steps audited per loop
    (default 3, quick 2); ``engines``: keys of :data:`accumguard.demo.loops.ENGINES`;
    ``story``: run the story part (default: yes, except with ``quick``; it trains its
    own fixed runs whatever ``engines`` says)."""

    engines: tuple[str, ...] = ENGINES
    quick: bool = False  # a smaller matrix and 2 steps (for tests / a smoke check)
    out: Path = Path("accumguard-out")
    plot: bool = True
    steps: int | None = None
    model: str = "lm"
    world_size: int = 2
    accumulation_steps: int = 4
    timeout: float = 600.0
    bugs: tuple[str, ...] | None = None
    story: bool | None = None

    def __post_init__(self) -> None:
        for e in self.engines:
            if e not in ENGINES:
                raise ConfigError(f"unknown engine {e!r} in --engines; choose from "
                                  f"{', '.join(ENGINES)} (or 'all', 'deepspeed', 'fsdp2')")
        if not self.engines:
            raise ConfigError("no engine selected; pass e.g. --engines ddp,fsdp2")
        if self.world_size < 2:
            raise ConfigError(f"world_size ({self.world_size}) must be ≥ 2: the demo shows "
                              "distributed accumulation")

    @property
    def n_steps(self) -> int:
        return self.steps if self.steps is not None else (2 if self.quick else 3)

    @property
    def run_story(self) -> bool:
        return self.story if self.story is not None else not self.quick


def parse_engines(text: str) -> tuple[str, ...]:
    """``"ddp,fsdp2"`` → engine keys; ``fsdp2``/``deepspeed`` expand to their variants,
    ``all`` to every engine."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "all":
            names = list(ENGINES)
        elif part in ("fsdp2", "deepspeed"):
            names = [e for e in ENGINES if e.startswith(part)]
        elif part in ENGINES:
            names = [part]
        else:
            raise ConfigError(f"unknown engine {part!r} in --engines; choose from "
                              f"{', '.join(ENGINES)}, fsdp2, deepspeed or all")
        out += [n for n in names if n not in out]
    if not out:
        raise ConfigError(f"--engines {text!r} selects no engine; e.g. --engines ddp,fsdp2")
    return tuple(out)


def _family(engine: str) -> str:
    """Loops of one family share ONE spawn: torch engines start in seconds, DeepSpeed ranks
    pay a long import once."""
    return "deepspeed" if engine.startswith("deepspeed") else "torch"


# ----------------------------------------------------------------------------- running
def _row_from_report(item: CatalogLoop, report: AuditReport) -> DemoRow:
    diag = report.diagnosis
    bug_id = getattr(diag, "bug_id", None) if diag is not None else None
    if item.expected == "pass":
        ok = bool(report.passed)
    else:
        ok = (not report.passed) and bug_id == item.expected
    counts = report.counts_per_step() if report.steps else {}
    runner = getattr(diag, "runner_up", None) if diag is not None else None
    note = ""
    if not report.passed and item.expected == "pass":
        note = "; ".join(report.failures[:2])
    elif report.passed and item.expected != "pass":
        note = "broken loop passed the audit"
    return DemoRow(
        engine=item.engine, loop=item.name, kind=item.kind, expected=item.expected,
        description=item.description, verdict="PASS" if report.passed else "FAIL",
        as_expected=ok, max_update_error=_finite(report.max_update_error),
        diagnosis=bug_id, diagnosis_summary=diag.summary() if diag is not None else None,
        runner_up=None if runner is None else f"{runner.id} (residual {runner.residual:.2g})",
        collectives_per_step=counts.get("grad_collective_rounds"),
        optimizer_steps=report.optimizer_steps, reference_steps=report.reference_steps,
        note=note)


def _finite(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def _error_row(item: CatalogLoop, verdict: str, note: str) -> DemoRow:
    return DemoRow(engine=item.engine, loop=item.name, kind=item.kind, expected=item.expected,
                   description=item.description, verdict=verdict,
                   as_expected=None if verdict == "SKIP" else False, note=note)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    # A rank traceback ends with the actual error: show that.
    tail = [t for t in text if t.strip()]
    return f"{type(exc).__name__}: {tail[-1].strip() if tail else ''}"[:200]


def _audit_group(setup: AuditSetup, items: list[CatalogLoop], opts: DemoOptions,
                 advance: Callable[[str, int], None]) -> dict[str, Any]:
    """Audit ``items`` in one spawn; on a rank failure, isolate the failing loop(s) by
    auditing each loop on its own (so one bad cell does not blank the whole family)."""
    from accumguard.verify.audit import audit_many

    seen: dict[str, int] = {}
    expected = len(items) * opts.n_steps

    def progress(name: str, done: int, total: int) -> None:
        # Broken loops may step more often than the reference: clamp to the expected total.
        done = min(done, total)
        n = done - seen.get(name, 0)
        if n > 0:
            seen[name] = done
            advance(f"{name}", n)
            if sum(seen.values()) == expected:
                advance("ranks done; comparing with the fp64 reference, diagnosing", 0)

    loops = {it.key: it.loop for it in items}
    try:
        return audit_many(setup, loops, world_size=opts.world_size, timeout=opts.timeout,
                          progress=progress)
    except Exception as exc:  # noqa: BLE001 - isolate below, report per cell
        if len(items) == 1:
            return {items[0].key: exc}
        out: dict[str, Any] = {}
        for it in items:
            try:
                out.update(audit_many(setup, {it.key: it.loop}, world_size=opts.world_size,
                                      timeout=opts.timeout, progress=progress))
            except Exception as inner:  # noqa: BLE001
                out[it.key] = inner
        return out


def run_demo(opts: DemoOptions, stream: TextIO | None = None) -> DemoResult:
    """Run the matrix, print progress and the table to ``stream``, write the JSON report
    (and the plot unless ``opts.plot`` is False) into ``opts.out``."""
    stream = stream if stream is not None else sys.stdout
    out = Output(stream)
    t0 = time.monotonic()
    setup = demo_setup(model=opts.model, steps=opts.n_steps,
                       accumulation_steps=opts.accumulation_steps)
    items = catalog(opts.engines, quick=opts.quick, bugs=opts.bugs)
    notes: list[str] = []
    rows: dict[str, DemoRow] = {}
    runnable: list[CatalogLoop] = []
    for engine in opts.engines:
        why = engine_available(engine)
        mine = [it for it in items if it.engine == engine]
        if why is None:
            runnable += mine
            continue
        skip = why.startswith("deepspeed is not installed")
        notes.append(f"{engine}: skipped, {why}" if skip else f"{engine}: {why}")
        for it in mine:
            rows[it.key] = _error_row(it, "SKIP" if skip else "ERROR",
                                      "deepspeed not installed" if skip else "adapter unavailable")
    out.line(f"accumguard demo: {_describe(opts, setup)}")
    for n in notes:
        out.line(f"note: {n}")
    families: dict[str, list[CatalogLoop]] = {}
    for it in runnable:
        families.setdefault(_family(it.engine), []).append(it)
    if "deepspeed" in families:
        out.line("note: DeepSpeed ranks import torch's compiler stack on first use "
                 "(~30-60 s on 2 CPU cores), and compile a small op on the very first run")
    reports: dict[str, Any] = {}
    timings: dict[str, float] = {}
    prev_threads = torch.get_num_threads()
    # The parent computes the fp64 reference and the diagnosis while 2 ranks share the cores;
    # more threads than cores makes CPU torch spin and run many times slower.
    torch.set_num_threads(1)
    try:
        total = len(runnable) * opts.n_steps
        with out.progress(total) as advance:
            for family, group in families.items():
                tf = time.monotonic()
                got = _audit_group(setup, group, opts, advance)
                timings[family] = round(time.monotonic() - tf, 1)
                for it in group:
                    rep = got.get(it.key)
                    if isinstance(rep, BaseException) or rep is None:
                        why = "no report" if rep is None else _first_line(rep)
                        rows[it.key] = _error_row(it, "ERROR", why)
                        reports[it.key] = {"error": why}
                    else:
                        rows[it.key] = _row_from_report(it, rep)
                        reports[it.key] = rep
    finally:
        torch.set_num_threads(prev_threads)
    ordered = [rows[it.key] for it in items]
    out.line("")
    out.table(ordered)
    result = DemoResult(rows=ordered, reports=reports, notes=notes, elapsed_s=0.0,
                        out_dir=Path(opts.out), timings=timings)
    _explain(out, result)
    if opts.run_story:
        result.story = _story_part(out, opts, timings)
    elif opts.quick:
        out.line("note: the story part (ZeRO-2 hand loop vs the large batch over 32 steps) "
                 "is skipped with --quick")
    result.elapsed_s = time.monotonic() - t0
    result.out_dir.mkdir(parents=True, exist_ok=True)
    result.json_path = _write_json(result, opts, setup)
    if opts.plot:
        _write_plots(out, result, opts)
    out.line(f"report: {result.json_path}")
    for path in (result.plot_path, result.story_plot_path):
        if path is not None:
            out.line(f"plot:   {path}")
    verdict = "all verdicts as expected" if result.ok else "SOME VERDICTS NOT AS EXPECTED"
    out.line(f"{verdict} ({result.elapsed_s:.0f} s; "
             + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ")")
    lines = summary_lines(result.rows, result.story)
    if lines:
        out.line("")
        out.line("what went wrong, by how much, and the fix:")
        for text in lines:
            out.line(text)
    return result


def _story_part(out: Output, opts: DemoOptions, timings: dict[str, float]) -> StoryResult:
    """Train the story's runs (one spawn) and print its table and headline."""
    import importlib.util

    from accumguard.demo.story import STORY_STEPS, run_story

    out.line("")
    out.line(f"story: training the LM for {STORY_STEPS} optimizer steps: the large batch "
             "(1 process), DDP + Accumulator, and DeepSpeed ZeRO-2 with the hand loop, with "
             "the Accumulator and with its own GA (one spawn, ~30-60 s)...")
    tf = time.monotonic()
    setup = demo_setup(model="lm", steps=STORY_STEPS, accumulation_steps=opts.accumulation_steps)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the parent's large batch runs beside 2 ranks on shared cores
    try:
        story = run_story(setup, world_size=opts.world_size, timeout=opts.timeout,
                          deepspeed=importlib.util.find_spec("deepspeed") is not None)
    finally:
        torch.set_num_threads(prev_threads)
    timings["story"] = round(time.monotonic() - tf, 1)
    heading, cells, oks = story_lines(story)
    out.line("")
    out.grid(heading, STORY_HEADERS, cells, oks)
    for note in story.notes:
        out.line(f"note: {note}")
    headline = story.headline()
    if headline:
        out.line(headline)
    return story


def _write_plots(out: Output, result: DemoResult, opts: DemoOptions) -> None:
    try:
        from accumguard.demo.plots import plot_story, plot_update_errors

        result.plot_path = plot_update_errors(
            result.rows, result.reports, opts.engines, result.out_dir,
            accumulation_steps=opts.accumulation_steps, world_size=opts.world_size)
        if result.story is not None:
            result.story_plot_path = plot_story(result.story, result.out_dir)
    except ImportError:
        out.line("note: matplotlib is not installed, no plot written "
                 "(pip install 'accumguard[plot]')")


def _describe(opts: DemoOptions, setup: AuditSetup) -> str:
    model = setup.build_model()
    n = sum(p.numel() for p in model.parameters())
    kind = "tiny causal transformer LM" if opts.model == "lm" else "token MLP"
    return (f"{kind} ({n / 1e6:.2f} M parameters), synthetic variable-length sequences, "
            f"W={opts.world_size} CPU ranks (gloo), K={opts.accumulation_steps}, "
            f"{opts.n_steps} optimizer steps per loop, reference: one fp64 process")


def _explain(out: Output, result: DemoResult) -> None:
    """Under the table: the diagnosis and fix of each broken loop, and anything unexpected."""
    out.line("")
    for r in result.rows:
        if r.kind == "broken" and r.diagnosis_summary:
            out.line(f"{r.key}: {r.description}")
            out.line(f"    diagnosed {r.diagnosis_summary}")
        if r.as_expected is False:
            out.line(f"{r.key}: NOT AS EXPECTED (expected {r.expected}, got {r.verdict}"
                     f"{', ' + r.diagnosis if r.diagnosis else ''}) {r.note}".rstrip())


def _write_json(result: DemoResult, opts: DemoOptions, setup: AuditSetup) -> Path:
    from accumguard import __version__

    reports = {}
    for key, rep in result.reports.items():
        reports[key] = rep if isinstance(rep, dict) else rep.to_dict()
    doc = {
        "version": JSON_VERSION,
        "accumguard": __version__,
        "torch": torch.__version__,
        "setup": {"model": opts.model, "world_size": opts.world_size,
                  "accumulation_steps": opts.accumulation_steps, "steps": opts.n_steps,
                  "engines": list(opts.engines), "quick": opts.quick,
                  "story": result.story is not None},
        "passed": result.ok,
        "elapsed_s": round(result.elapsed_s, 1),
        "timings_s": result.timings,
        "notes": result.notes,
        "rows": [asdict(r) for r in result.rows],
        "reports": reports,
        # The story part: per-run eval loss after 0..N optimizer steps (None when skipped).
        "story": None if result.story is None else result.story.to_dict(),
    }
    path = result.out_dir / "demo-report.json"
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return path


# ----------------------------------------------------------------------------- curves
@dataclass
class CurvesResult:
    """Loss per optimizer step for each K at one effective batch, and how far they differ."""

    ks: tuple[int, ...]
    losses: dict[int, list[float]]
    max_deviation: float
    elapsed_s: float
    plot_path: Path | None = None


def _curves_data(rank: int, world: int, *, k: int, steps: int, rows_per_step: int,
                 seed: int) -> list[dict[str, torch.Tensor]]:
    """Rank ``rank``'s data: the same ``rows_per_step`` sequences per optimizer step for
    every K, cut into K micro-batches of ``rows_per_step / K`` rows."""
    full = make_lm_batches(seed=seed, world_size=world, micro_batches=steps,
                           micro_batch_size=rows_per_step, seq_len=16, vocab=64)[rank]
    rows = rows_per_step // k
    return [{key: v[i * rows:(i + 1) * rows] for key, v in batch.items()}
            for batch in full for i in range(k)]


def _curves_worker(rank: int, world: int, ks: tuple[int, ...], steps: int, rows_per_step: int,
                   seed: int) -> dict[int, list[float]]:
    from torch.nn.parallel import DistributedDataParallel

    from accumguard import Accumulator

    setup = demo_setup(model="lm", steps=1, seed=seed)
    out: dict[int, list[float]] = {}
    for k in ks:
        model = DistributedDataParallel(setup.build_model())
        opt = setup.make_optimizer(model.parameters())
        assert setup.make_scheduler is not None
        acc = Accumulator(model, opt, accumulation_steps=k, engine="auto",
                          scheduler=setup.make_scheduler(opt), count_fn=count_tokens)
        losses = []
        with acc:
            for window in acc.windows(_curves_data(rank, world, k=k, steps=steps,
                                                   rows_per_step=rows_per_step, seed=seed)):
                def loss(b: dict[str, torch.Tensor],
                         model: torch.nn.Module = model) -> torch.Tensor:
                    return token_loss(model, b)[0]

                result = window.run(loss)
                losses.append(float(result.loss) if result.loss is not None else math.nan)
        out[k] = losses  # this rank's share; the parent sums the ranks
    return out


def run_curves(*, ks: tuple[int, ...] = (1, 2, 4, 8), steps: int = 12, rows_per_step: int = 8,
               out_dir: Path = Path("accumguard-out"), plot: bool = True,
               world_size: int = 2, timeout: float = 300.0, seed: int = 0,
               stream: TextIO | None = None) -> CurvesResult:
    """Train the demo LM with the Accumulator on DDP for each K at one effective batch
    (``rows_per_step`` sequences per rank and step) and compare the loss curves: with exact
    accumulation they coincide up to fp32 rounding."""
    from accumguard.runtime.launch import run_on_ranks

    stream = stream if stream is not None else sys.stdout
    for k in ks:
        if not isinstance(k, int) or k < 1 or rows_per_step % k:
            raise ConfigError(f"K={k!r} must be a positive divisor of the {rows_per_step} "
                              "sequences per rank and step (the effective batch is fixed)")
    print(f"accumguard curves: tiny causal LM, W={world_size}, {rows_per_step} sequences per "
          f"rank and step, K in {list(ks)}, {steps} optimizer steps (Accumulator on DDP)",
          file=stream, flush=True)
    t0 = time.monotonic()
    per_rank = run_on_ranks(_curves_worker, world_size, (tuple(ks), steps, rows_per_step, seed),
                            timeout=timeout)
    losses = {k: [sum(r[k][i] for r in per_rank) for i in range(steps)] for k in ks}
    base = losses[ks[0]]
    dev = max((abs(a - b) for k in ks for a, b in zip(losses[k], base, strict=True)),
              default=0.0)
    result = CurvesResult(ks=tuple(ks), losses=losses, max_deviation=dev,
                          elapsed_s=time.monotonic() - t0)
    width = max(len(f"K={k}") for k in ks)
    for k in ks:
        print(f"  K={k:<{width - 2}} " + " ".join(f"{x:.4f}" for x in losses[k]), file=stream)
    print(f"max |loss(K) - loss(K={ks[0]})| over all steps: {dev:.2e}", file=stream)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "curves.json").write_text(json.dumps(
        {"version": JSON_VERSION, "ks": list(ks), "losses": {str(k): v for k, v in
                                                              losses.items()},
         "max_deviation": dev, "world_size": world_size, "rows_per_step": rows_per_step},
        indent=2) + "\n")
    if plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("note: matplotlib is not installed, no plot written "
                  "(pip install 'accumguard[plot]')", file=stream)
        else:
            fig, ax = plt.subplots(figsize=(6, 4))
            for i, k in enumerate(ks):
                ax.plot(range(1, steps + 1), losses[k], marker="o", ms=4 + 2 * (len(ks) - i),
                        alpha=0.7, label=f"K={k} (micro-batch {rows_per_step // k})")
            ax.set_xlabel("optimizer step")
            ax.set_ylabel("loss (full effective batch)")
            ax.set_title(f"Same effective batch, different K: max deviation {dev:.1e}",
                         fontsize=9)
            ax.legend(fontsize=8)
            fig.tight_layout()
            result.plot_path = out_dir / "curves.png"
            fig.savefig(result.plot_path, dpi=110)
            plt.close(fig)
            print(f"plot: {result.plot_path}", file=stream)
    return result
