"""``accumguard demo --frameworks``: each framework's broken default next to the accumguard way.

For every installed framework (transformers ``Trainer``, Lightning, Accelerate) two runs on
the same tiny model, the same seeded token data (uneven valid-token counts across micro-steps
and ranks, a partial final window) and K = 4 on W = 2 gloo ranks:

* the broken default a user writes: a token-mean loss per micro-batch (the HF
  ``compute_loss`` override ignoring ``num_items_in_batch``; Lightning's automatic
  accumulation dividing the mean by K; ``accelerator.backward(token_mean)``), with the
  framework's accumguard checks attached: expected to miss the fp64 large batch by ≥ 1e-2
  and to be flagged F5;
* the accumguard way (``exact_token_loss``; ``AccumguardCallback(exact=True)`` with a summed
  loss; ``accumulator(accelerator, ...)``): expected within 1e-5 of the reference after
  every step, with no finding.

All frameworks run in ONE spawn of 2 ranks (the ranks' start-up and imports dominate);
the fp64 single-process references run in the parent. The builders at the top (models
from configs, seeded token samples, the summed loss, the reference comparison) are the
ones tests/integrations uses too.

The shared builders (models, data, losses, the reference comparison) live in
:mod:`._fw_models` and are re-exported here, where tests/integrations import them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch
import torch.nn.functional as F

from accumguard.demo._fw_models import (
    BROKEN_MIN,
    EXACT_TOL,
    IGNORE,
    SEQ,
    VOCAB,
    Batch,
    Params,
    count_tokens,
    hf_samples,
    mean_loss,
    plain,
    shifted_sum_loss,
    sum_loss,
    tiny_gpt2,
    tiny_llama,
    token_samples,
    update_errors,
)
from accumguard.demo.records import FrameworkRow
from accumguard.verify.reference import flat_params

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState

    from accumguard.integrations._checks import Finding

__all__ = ["BROKEN_MIN", "EXACT_TOL", "FRAMEWORKS", "FrameworkRow", "FrameworksResult",
           "count_tokens", "flat_params", "hf_samples", "mean_loss", "plain",
           "parse_frameworks", "run_frameworks_demo", "shifted_sum_loss", "sum_loss",
           "tiny_gpt2", "tiny_llama", "token_samples", "update_errors", "REPORT_JSON"]

# ----------------------------------------------------------------------------- the runs
K = 4
WORLD = 2
LR = 0.3
SAMPLES = 40  # micro-batches of 2 -> 10 per rank -> windows of 4, 4 and a partial 2
REPORT_JSON = "frameworks-report.json"
JSON_VERSION = 1

# name -> (title, import names (any one), pip command, model builder, the two runs' labels)
FRAMEWORKS: dict[str, dict[str, Any]] = {
    "transformers": {
        "title": "transformers Trainer",
        "modules": ("transformers", "accelerate"),
        "pip": "pip install 'accumguard[transformers]'",
        "broken": "compute_loss override: token mean, num_items_in_batch ignored",
        "exact": "compute_loss with exact_token_loss(...) + AccumguardCallback()",
        "short": ("token-mean compute_loss", "exact_token_loss"),
    },
    "lightning": {
        "title": "Lightning",
        "modules": ("pytorch_lightning|lightning", "transformers"),
        "pip": "pip install 'accumguard[lightning]' 'accumguard[transformers]'",
        "broken": "accumulate_grad_batches=4, training_step returns the token mean",
        "exact": "summed loss + AccumguardCallback(exact=True)",
        "short": ("token mean / K", "AccumguardCallback(exact=True)"),
    },
    "accelerate": {
        "title": "Accelerate",
        "modules": ("accelerate", "transformers"),
        "pip": "pip install 'accumguard[accelerate]' 'accumguard[transformers]'",
        "broken": "accelerator.accumulate + accelerator.backward(token mean)",
        "exact": "accumulator(accelerator, ...).windows(loader), summed loss",
        "short": ("accelerator.backward(token mean)", "accumulator(accelerator, ...)"),
    },
}


def _opt(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def _sched(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


def _findings(items: Sequence[Finding | dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for f in items:
        d = f if isinstance(f, dict) else f.as_dict()
        out.append({k: d[k] for k in ("step", "class_id", "evidence")})
    return out


def _run_transformers(rank: int, world: int) -> dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from accumguard.integrations.transformers import AccumguardCallback, exact_token_loss

    class Recording(Trainer):
        """Records each micro-batch it trains on; ``exact`` picks the loss."""

        exact = True
        current: list[Batch]

        def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any],
                         return_outputs: bool = False,
                         num_items_in_batch: torch.Tensor | int | None = None) -> Any:
            self.current.append(plain(inputs))
            out = model(input_ids=inputs["input_ids"])
            if self.exact:  # the one-line change
                loss = exact_token_loss(self, out.logits, inputs["labels"], num_items_in_batch)
            else:  # the 2024 bug: a per-micro-batch token mean, num_items_in_batch ignored
                logits, labels = out.logits[..., :-1, :], inputs["labels"][..., 1:]
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1),
                                       ignore_index=IGNORE)
            return (loss, out) if return_outputs else loss

    class Snapshots(TrainerCallback):
        def __init__(self, trainer: Recording) -> None:
            self.trainer = trainer
            self.windows: list[list[Batch]] = []
            self.snaps: list[Params] = []

        def on_step_end(self, args: TrainingArguments, state: TrainerState,
                        control: TrainerControl, model: torch.nn.Module | None = None,
                        **kw: object) -> None:
            assert model is not None  # (the Trainer passes its model)
            self.windows.append(self.trainer.current)
            self.trainer.current = []
            self.snaps.append(flat_params(model))

    out: dict[str, Any] = {}
    for run in ("broken", "exact"):
        model = tiny_gpt2(0)
        model.loss_type = "ForCausalLM"  # type: ignore[assignment]  # GPT-2's None makes the Trainer count unshifted labels
        opt = _opt(model.parameters())
        with tempfile.TemporaryDirectory(prefix="accumguard-hf-") as tmp:
            args = TrainingArguments(
                output_dir=tmp, use_cpu=True, per_device_train_batch_size=2,
                gradient_accumulation_steps=K, num_train_epochs=1, max_grad_norm=0.0,
                report_to="none", save_strategy="no", disable_tqdm=True, logging_steps=1,
                ddp_find_unused_parameters=False, seed=0)
            cb = AccumguardCallback(every_n_steps=1)
            trainer = Recording(model=model, args=args, train_dataset=hf_samples(SAMPLES, 7),
                                optimizers=(opt, _sched(opt)), callbacks=[cb])
            trainer.exact, trainer.current = run == "exact", []
            snaps = Snapshots(trainer)
            trainer.add_callback(snaps)
            trainer.train()
        out[run] = {"windows": snaps.windows, "snaps": snaps.snaps,
                    "findings": _findings(trainer.state.accumguard_findings)}  # type: ignore[attr-defined]
    return out


def _run_lightning(rank: int, world: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from accumguard.integrations import lightning as agl

    pl: Any = agl.pl  # type: ignore[attr-defined]  # the Lightning package the integration was built on
    # Lightning sets its loggers to INFO when imported: its banners would bury the table.
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    class LM(pl.LightningModule):  # type: ignore[misc]
        def __init__(self, summed: bool) -> None:
            super().__init__()
            self.model = tiny_llama(0)
            self.summed = summed

        def training_step(self, batch: Batch, idx: int) -> torch.Tensor:
            if self.summed:
                return sum_loss(self.model, batch)[0]  # the one change: sum, not mean
            return mean_loss(self.model, batch)

        def configure_optimizers(self) -> dict[str, object]:
            opt = _opt(self.parameters())
            return {"optimizer": opt,
                    "lr_scheduler": {"scheduler": _sched(opt), "interval": "step"}}

    class Recorder(pl.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.windows: list[list[Batch]] = []
            self.snaps: list[Params] = []
            self.current: list[Batch] = []
            self.step = 0

        def on_train_batch_start(self, trainer: object, module: object,
                                 batch: dict[str, object], i: int) -> None:
            self.current.append(plain(batch))

        def on_train_batch_end(self, trainer: Any, module: Any, out: object, batch: object,
                               i: int) -> None:
            if trainer.global_step > self.step:
                self.step = trainer.global_step
                self.windows.append(self.current)
                self.current = []
                self.snaps.append(flat_params(module.model))

    out: dict[str, Any] = {}
    for run in ("broken", "exact"):
        exact = run == "exact"
        cb = agl.AccumguardCallback(exact=exact, accumulation_steps=K, every_n_steps=1)
        rec = Recorder()
        trainer = pl.Trainer(
            accelerator="cpu", devices=world, strategy="ddp", max_epochs=1,
            accumulate_grad_batches=K, callbacks=[cb, rec], logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0)
        loader: Any = DataLoader(token_samples(SAMPLES, seed=5),  # type: ignore[arg-type]
                                 batch_size=2, shuffle=False)
        trainer.fit(LM(summed=exact), loader)
        out[run] = {"windows": rec.windows, "snaps": rec.snaps, "findings": _findings(cb.findings)}
    return out


def _run_accelerate(rank: int, world: int) -> dict[str, Any]:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from accumguard.integrations.accelerate import accumulator, watch

    out: dict[str, Any] = {}
    for run in ("broken", "exact"):
        accel = Accelerator(gradient_accumulation_steps=K, cpu=True)
        model = tiny_llama(0)
        opt = _opt(model.parameters())
        sched = _sched(opt)
        loader: Any = DataLoader(token_samples(SAMPLES, seed=3),  # type: ignore[arg-type]
                                 batch_size=2, shuffle=False)
        model, opt, loader, sched = accel.prepare(model, opt, loader, sched)
        checks = watch(accel, model, opt, scheduler=sched, every_n_steps=1)
        windows: list[list[Batch]] = []
        snaps: list[Params] = []
        if run == "exact":
            acc = accumulator(accel, model, opt, scheduler=sched, count_fn=count_tokens)
            for window in acc.windows(loader):
                windows.append([plain(b) for b in window.batches])
                window.run(lambda b, m=model: sum_loss(m, b)[0])  # type: ignore[misc]
                snaps.append(flat_params(model))
            acc.close()
        else:  # the documented Accelerate loop with a token-mean loss
            current: list[Batch] = []
            for batch in loader:
                with accel.accumulate(model):
                    current.append(plain(batch))
                    accel.backward(mean_loss(model, batch))
                    opt.step()
                    sched.step()
                    opt.zero_grad()
                if accel.sync_gradients:
                    windows.append(current)
                    current = []
                    snaps.append(flat_params(model))
        checks.close()
        out[run] = {"windows": windows, "snaps": snaps, "findings": _findings(checks.findings)}
    return out


_RUNNERS = {"transformers": _run_transformers, "lightning": _run_lightning,
            "accelerate": _run_accelerate}
# The reference of each framework's runs: (model builder, summed loss).
_REFERENCE = {"transformers": (tiny_gpt2, shifted_sum_loss), "lightning": (tiny_llama, sum_loss),
              "accelerate": (tiny_llama, sum_loss)}


def _worker(rank: int, world: int, names: tuple[str, ...]) -> dict[str, Any]:
    """All selected frameworks in one process per rank (one spawn for the whole demo).

    A framework that raises is reported (its message) rather than killing the others' runs.
    """
    import contextlib
    import io
    import warnings

    # The frameworks' banners, per-step log prints and deprecation warnings would bury the
    # table; the findings are returned and printed by the parent, real errors still reach
    # stderr (and each framework's exception is returned).
    warnings.filterwarnings("ignore")
    for name in ("transformers", "pytorch_lightning", "lightning", "lightning.pytorch",
                 "accelerate", "accumguard"):
        logging.getLogger(name).setLevel(logging.ERROR)
    out: dict[str, Any] = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                out[name] = _RUNNERS[name](rank, world)
        except Exception as exc:  # noqa: BLE001 - reported as this framework's ERROR row
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out[name]["elapsed_s"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- verdicts
@dataclass
class FrameworksResult:
    rows: list[FrameworkRow]
    elapsed_s: float
    timings_s: dict[str, float]
    files: list[str]

    @property
    def passed(self) -> bool:
        return all(r.as_expected is not False for r in self.rows)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def parse_frameworks(text: str | None) -> tuple[str, ...]:
    """``None``/``"all"`` -> every framework; else a comma-separated subset."""
    from accumguard.core.errors import ConfigError

    if text is None or text.strip() == "all":
        return tuple(FRAMEWORKS)
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    for n in names:
        if n not in FRAMEWORKS:
            raise ConfigError(f"unknown framework {n!r} in --frameworks {text!r}; expected a "
                              f"comma-separated subset of {', '.join(FRAMEWORKS)} (or all)")
    if not names:
        raise ConfigError(f"--frameworks {text!r} selects no framework; e.g. "
                          "--frameworks transformers,lightning")
    return names


def _missing(name: str) -> list[str]:
    missing = []
    for spec in FRAMEWORKS[name]["modules"]:
        if not any(importlib.util.find_spec(m) is not None for m in spec.split("|")):
            missing.append(spec.replace("|", " or "))
    return missing


def _row(name: str, run: str, verdict: str, as_expected: bool | None, note: str = "") -> FrameworkRow:
    """A row for ``name``'s ``run`` ("broken" or "exact"), labelled from :data:`FRAMEWORKS`."""
    info = FRAMEWORKS[name]
    return FrameworkRow(framework=name, run=run, label=info[run],
                        expected="pass" if run == "exact" else "F5", verdict=verdict,
                        as_expected=as_expected, note=note,
                        short=info["short"][run == "exact"])


def _judge(name: str, run: str, ranks: list[dict[str, Any]]) -> FrameworkRow:
    row = _row(name, run, "ERROR", False)
    data = [r[name][run] for r in ranks]
    row.window_sizes = [len(w) for w in data[0]["windows"]]
    build, loss_fn = _REFERENCE[name]
    try:
        errs = update_errors(build(0), _opt, _sched, [d["windows"] for d in data],
                             data[0]["snaps"], loss_fn=loss_fn)
    except AssertionError as exc:  # the ranks did not step together: nothing to compare
        row.note = f"no comparison: {exc}"
        return row
    row.update_errors = errs
    row.max_update_error = max(errs) if errs else None
    seen: set[tuple[int, str]] = set()
    for rank, d in enumerate(data):  # each rank's findings, once per (step, class)
        for f in d["findings"]:
            if (f["step"], f["class_id"]) not in seen:
                seen.add((f["step"], f["class_id"]))
                row.findings.append({**f, "rank": rank})
    exact = row.max_update_error is not None and row.max_update_error <= EXACT_TOL
    row.verdict = "PASS" if exact else "FAIL"
    if run == "exact":
        row.as_expected = exact and not row.findings
        if exact and row.findings:
            row.note = "exact but flagged (false alarm)"
    else:
        far = min(errs) >= BROKEN_MIN if errs else False
        row.as_expected = far and "F5" in row.classes
        if not far:
            row.note = f"not off by ≥ {BROKEN_MIN:g} at every step"
        elif "F5" not in row.classes:
            row.note = "not flagged F5"
    return row


# ----------------------------------------------------------------------------- the command
def run_frameworks_demo(names: tuple[str, ...] | None = None, *, out_dir: Path | str =
                        "accumguard-out", plot: bool = True, timeout: float = 600.0,
                        stream: TextIO | None = None) -> FrameworksResult:
    """Run, judge, print the table and the findings, write the JSON and the PNG."""
    import sys

    from accumguard.demo.console import Output, fmt_err
    from accumguard.runtime.launch import run_on_ranks

    out = Output(stream if stream is not None else sys.stdout)
    names = names or tuple(FRAMEWORKS)
    t0 = time.perf_counter()
    rows: list[FrameworkRow] = []
    timings: dict[str, float] = {}
    runnable = []
    for n in names:
        missing = _missing(n)
        if missing:
            note = f"not installed ({', '.join(missing)}): {FRAMEWORKS[n]['pip']}"
            rows += [_row(n, run, "SKIP", None, note=note) for run in ("broken", "exact")]
        else:
            runnable.append(n)
    out.line(f"accumguard demo --frameworks: {', '.join(runnable) or 'nothing to run'} on "
             f"{WORLD} gloo ranks (CPU), K={K}, {SAMPLES} sequences of ≤ {SEQ} tokens with "
             "uneven valid-token counts, fp64 large-batch reference")
    if runnable:
        t1 = time.perf_counter()
        ranks = run_on_ranks(_worker, WORLD, (tuple(runnable),), timeout=timeout)
        timings["ranks"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        for n in runnable:
            timings[n] = max(float(r[n]["elapsed_s"]) for r in ranks)
            errors = [r[n]["error"] for r in ranks if "error" in r[n]]
            if errors:
                rows += [_row(n, run, "ERROR", False, note=errors[0])
                         for run in ("broken", "exact")]
                continue
            rows += [_judge(n, run, ranks) for run in ("broken", "exact")]
        timings["references"] = time.perf_counter() - t2
    order = {n: i for i, n in enumerate(names)}
    rows.sort(key=lambda r: (order[r.framework], r.run != "broken"))

    headers = ["framework", "run", "expected", "verdict", "max rel. update err", "findings",
               "ok"]
    cells = [[FRAMEWORKS[r.framework]["title"], r.label, r.expected, r.verdict,
              fmt_err(r.max_update_error),
              ",".join(r.classes) or ("-" if r.verdict in ("PASS", "FAIL") else r.note),
              {True: "yes", False: "NO", None: "-"}[r.as_expected]] for r in rows]
    out.line()
    out.grid(f"accumguard demo --frameworks: each framework's default vs the accumguard way "
             f"(K={K}, W={WORLD}; exact: ≤ {EXACT_TOL:g} after every step)", headers, cells,
             [r.as_expected for r in rows])
    out.line()
    for r in rows:
        if r.findings:
            f = r.findings[0]
            more = f" (+{len(r.findings) - 1} more)" if len(r.findings) > 1 else ""
            out.line(f"{FRAMEWORKS[r.framework]['title']}, {r.run}: step {f['step']}: "
                     f"{f['class_id']}: {f['evidence']}{more}")
        if r.note and r.verdict in ("PASS", "FAIL", "ERROR"):
            out.line(f"{FRAMEWORKS[r.framework]['title']}, {r.run}: {r.note}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    if plot and any(r.update_errors for r in rows):
        try:
            from accumguard.demo.plots import plot_framework_errors

            files.append(str(plot_framework_errors(rows, out_dir, tolerance=EXACT_TOL,
                                                   accumulation_steps=K, world_size=WORLD)))
        except ImportError as exc:
            out.line(f"no PNG: {exc} (pip install 'accumguard[plot]')")
    result = FrameworksResult(rows=rows, elapsed_s=time.perf_counter() - t0, timings_s=timings,
                              files=files)
    path = out_dir / REPORT_JSON
    path.write_text(json.dumps(_to_json(result), indent=2))
    files.append(str(path))
    for fname in files:
        out.line(f"wrote {fname}")
    n_bad = sum(r.as_expected is False for r in rows)
    out.line(f"verdict: {'every run as expected' if result.passed else f'{n_bad} run(s) NOT as expected'}"
             f" ({result.elapsed_s:.0f} s)")
    return result


def _to_json(result: FrameworksResult) -> dict[str, Any]:
    rows = []
    for r in result.rows:
        d = asdict(r)
        d["finding_classes"] = r.classes
        rows.append(d)
    return {"version": JSON_VERSION, "passed": result.passed,
            "elapsed_s": round(result.elapsed_s, 2),
            "timings_s": {k: round(v, 2) for k, v in result.timings_s.items()},
            "setup": {"world_size": WORLD, "accumulation_steps": K, "samples": SAMPLES,
                      "micro_batch_rows": 2, "lr": LR, "exact_tolerance": EXACT_TOL,
                      "broken_min": BROKEN_MIN},
            "rows": rows}
