"""Lightning: one callback for exact token-normalised accumulation and the checks.

The change to a LightningModule is one word, the loss is summed instead of
averaged (``reduction="sum"``); the Trainer gets one callback::

    trainer = Trainer(accumulate_grad_batches=4, callbacks=[AccumguardCallback(exact=True)])

Why: with automatic optimisation Lightning divides every micro-batch's loss by
``accumulate_grad_batches`` (also in a short final window), so a token-mean loss
with uneven token counts is failure class F5. With ``exact=True`` the callback
counts each micro-batch's valid tokens (``count_fn``, on ``on_train_batch_start``),
all-reduces the window's count N once, and in ``on_before_optimizer_step`` (after
the last backward and DDP's averaging, before Lightning's clipping and the step)
multiplies the accumulated gradient by ``K·W/N`` (automatic: undoes Lightning's ``1/K``
and DDP's ``1/W``) or ``W/N`` (manual optimisation, where Lightning does not divide):
the optimizer receives ``Σ g_i / N``. Scaling the accumulated gradient by one
scalar equals scaling every micro-step's loss by it, up to fp32 rounding. In manual
optimisation the ``training_step`` clips before ``opt.step()`` (``self.clip_gradients``
or torch's ``clip_grad_norm_``): the observation layer's clip event rescales first, so
the clip sees the normalised gradient.

The logged/progress-bar ``loss`` is then the sum over tokens divided by K (log
your own mean if you want one). Supported strategies: single device and DDP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, SupportsFloat

import torch

from accumguard.core.errors import ConfigError, MissingDependencyError
from accumguard.integrations._checks import (
    DEFAULT_EVERY_N_STEPS,
    AccumulationChecks,
    Finding,
    safe_callback,
)
from accumguard.integrations._figures import PREFIX

if TYPE_CHECKING:
    from accumguard.observe._events import ClipEvent
    from accumguard.observe._observer import Observer

try:  # the standalone package is what this was tested with; the unified one is the same API
    import pytorch_lightning as pl
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import lightning.pytorch as pl  # type: ignore[no-redef]
    except ImportError as err:
        raise MissingDependencyError("pytorch-lightning", "lightning",
                                     "accumguard.integrations.lightning") from err

__all__ = ["AccumguardCallback", "default_count"]


def default_count(batch: object) -> torch.Tensor:
    """Valid tokens of a ``{"labels": ...}`` batch (labels ``-100`` are ignored)."""
    labels = batch.get("labels") if isinstance(batch, dict) else None
    if not isinstance(labels, torch.Tensor):
        raise ConfigError(
            "exact=True needs the number of valid tokens of each batch; the batch has no "
            "'labels' tensor, so pass AccumguardCallback(count_fn=lambda batch: <count>)")
    return (labels != -100).sum()


#: The fix of each class in Lightning's terms (appended to the generic one).
FIX_HINTS = {
    "F5": "In Lightning: return the summed token loss from training_step and add "
          "AccumguardCallback(exact=True) (Lightning divides each micro-batch's loss by "
          "accumulate_grad_batches, right only for equal token counts).",
    "LOSS_SCALE": "In Lightning: return the summed token loss with "
                  "AccumguardCallback(exact=True), or divide by the window's global count "
                  "(count_fn= must count the tokens your loss averages, e.g. after a label "
                  "shift).",
    "F4": "In Lightning: let the Trainer step the scheduler (interval='step'), or in manual "
          "optimisation call sch.step() next to opt.step(), once per window.",
}


class AccumguardCallback(pl.Callback):
    """Exact token-normalised accumulation (``exact=True``) and accumulation checks.

    Args:
        exact: rescale the accumulated gradient so the optimizer gets ``Σ g_i / N``;
            ``training_step`` must then return the **sum** of token losses.
        count_fn: valid tokens of a batch (default :func:`default_count`).
        check: run the checks (token weights F5/F6/F10/F7, scheduler steps F4).
        accumulation_steps: K for manual optimisation (default: the Trainer's
            ``accumulate_grad_batches``).
        strict, every_n_steps, logits_module: passed to the checks.

    Findings are logged (logger ``accumguard``), kept in :attr:`findings` and in
    ``trainer.callback_metrics["accumguard_findings"]`` (their count). The last checked
    step's figures (``accumguard/backwards``, ``accumguard/conservation_error``,
    ``accumguard/token_weight_error``, ...: :mod:`accumguard.integrations._figures`) and the
    findings count (``accumguard/findings``) go through ``LightningModule.log`` to the
    Trainer's loggers (at their ``log_every_n_steps`` cadence: the latest checked step's); the findings' text to a logger whose ``experiment`` has
    ``add_text`` (TensorBoard) as ``accumguard/finding``.
    """

    def __init__(self, *, exact: bool = False,
                 count_fn: Callable[[Any], SupportsFloat] | None = None,
                 check: bool = True, accumulation_steps: int | None = None,
                 strict: bool = False, every_n_steps: int = DEFAULT_EVERY_N_STEPS,
                 logits_module: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.exact = exact
        self.count_fn = count_fn or default_count
        self.check = check
        self.accumulation_steps = accumulation_steps
        self.strict = strict
        self.every_n_steps = every_n_steps
        self.logits_module = logits_module
        self.checks: AccumulationChecks | None = None
        self.findings: list[Finding] = []
        self.window_counts: list[float] = []
        self._count = 0.0
        self._world = 1
        # manual exact: the observer whose clip events rescale, and its backward count at the
        # last rescale (rescaled since the last backward: the step leaves the gradient alone;
        # a window that clipped but skipped its step is not confused with the next one)
        self._clip_obs: Observer | None = None
        self._scaled_after = -1
        self._observer: Observer | None = None  # manual exact without checks: clip events only
        self._logged = 0  # findings already handed to the loggers
        self._figures: dict[str, float] = {}  # the last checked step's (see _log_figures)
        #: made by the ``ACCUMGUARD_LIGHTNING=1`` entry point (steps aside for one you added)
        self.from_environment = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.from_environment and any(isinstance(cb, AccumguardCallback) and cb is not self
                                         for cb in _callbacks(trainer)):
            self.check = False  # the callback the script added runs the checks
            return
        strategy = type(trainer.strategy).__name__
        if self.exact and strategy not in ("SingleDeviceStrategy", "DDPStrategy"):
            raise ConfigError(
                f"AccumguardCallback(exact=True) supports the single-device and DDP strategies; "
                f"this Trainer uses {strategy}, whose gradient reduction it does not model. Use "
                "strategy='ddp', or accumguard's engines for FSDP/DeepSpeed")
        self._world = int(trainer.world_size)
        k = self.accumulation_steps or int(trainer.accumulate_grad_batches)
        if self.check and trainer.optimizers:
            self._start_checks(trainer, pl_module, k)
        if self.exact and not pl_module.automatic_optimization:
            if self.checks is not None and self.checks.observer is not None:
                self._clip_obs = self.checks.observer
            else:
                from accumguard.observe import _profiles as profiles
                from accumguard.observe._observer import Observer

                self._clip_obs = self._observer = Observer.from_profile(
                    profiles.rescale(), [pl_module]).install()
            self._clip_obs.add_listener(_RescaleBeforeClip(self, trainer, pl_module))

    @safe_callback
    def _start_checks(self, trainer: pl.Trainer, pl_module: pl.LightningModule, k: int) -> None:
        """The checks only observe: an internal error here leaves them off, never the fit
        (the exact rescale, which is computation the user asked for, is not behind it)."""
        configs = getattr(trainer, "lr_scheduler_configs", [])
        sched = configs[0].scheduler if configs else None
        self.checks = AccumulationChecks(
            pl_module, trainer.optimizers[0], accumulation_steps=k, scheduler=sched,
            averages_over_ranks=self._world > 1, logits_module=self.logits_module,
            every_n_steps=self.every_n_steps, strict=self.strict,
            on_finding=self._on_finding, fix_hints=FIX_HINTS)

    def _on_finding(self, finding: Finding) -> None:
        self.findings.append(finding)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.exact:
            self._count += float(self.count_fn(batch))

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        if not self.exact:
            return
        obs = self._clip_obs
        if obs is not None and self._scaled_after == obs.backward_total:
            return  # done at the training_step's clip, after this window's last backward
        self._rescale(trainer, pl_module)

    def _rescale(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        n = torch.tensor([self._count], dtype=torch.float64)
        self._count = 0.0
        if self._world > 1:
            backend = torch.distributed.get_backend()
            dev = pl_module.device if backend == "nccl" else torch.device("cpu")
            n = n.to(dev)
            torch.distributed.all_reduce(n)
        total = float(n.item())
        self.window_counts.append(total)
        if total == 0:
            factor = 0.0  # no valid token anywhere in the window: the step must not move
        else:
            k = int(trainer.accumulate_grad_batches) if pl_module.automatic_optimization else 1
            factor = k * self._world / total
        with torch.no_grad():
            for p in pl_module.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        if self.checks is not None:
            self.checks.scale_next_window(factor)

    @safe_callback
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: object, batch: object, batch_idx: int) -> None:
        if self.checks is None:
            return
        self._write_new_findings(trainer)
        trainer.callback_metrics["accumguard_findings"] = torch.tensor(float(len(self.findings)))
        if _writes_logs_now(trainer):
            self._log_figures(pl_module)

    def _log_figures(self, pl_module: pl.LightningModule) -> None:
        """The latest checked step's figures, through the Trainer's loggers (on the batches
        Lightning writes: its ``log_every_n_steps`` cadence)."""
        assert self.checks is not None
        self._figures.update(self.checks.figures)
        self.checks.figures = {}
        if not self._figures and not self.findings:
            return
        figures = {**self._figures, "findings": float(len(self.findings))}
        for key, value in figures.items():
            pl_module.log(PREFIX + key, value, on_step=True, on_epoch=False, batch_size=1)

    def _write_new_findings(self, trainer: pl.Trainer) -> None:
        """New findings' text, at once, through each logger that takes text (TensorBoard)."""
        new = self.findings[self._logged:]
        self._logged = len(self.findings)
        if new and trainer.is_global_zero:
            text = "\n".join(f"step {f.step}: {f.class_id} {f.title}: {f.evidence}" for f in new)
            for lg in trainer.loggers:
                add_text = getattr(getattr(lg, "experiment", None), "add_text", None)
                if callable(add_text):
                    add_text(PREFIX + "finding", text, trainer.global_step)

    @safe_callback
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.checks is not None:
            self.checks.close()
            self._write_new_findings(trainer)  # the ones the last window's close made
            self.checks = None
        if self._observer is not None:
            self._observer.uninstall()
            self._observer = None

    @safe_callback
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # After an exception on_fit_end does not run: still remove every hook.
        self.on_fit_end(trainer, pl_module)


def _writes_logs_now(trainer: pl.Trainer) -> bool:
    """Whether Lightning hands this batch's ``on_step`` values to its loggers right after
    ``on_train_batch_end`` (its own test: not while accumulating under automatic optimisation,
    then every ``log_every_n_steps`` stepped batches). ``LightningModule.log`` costs about a
    millisecond per key, so the figures are logged only on the batches that are written;
    when Lightning's internals are not where 2.6 keeps them, every batch logs (always right,
    only slower)."""
    try:
        loop = trainer.fit_loop
        if trainer.lightning_module.automatic_optimization and loop._should_accumulate():
            return False
        conn = trainer._logger_connector
        return bool(conn.should_update_logs or getattr(trainer, "fast_dev_run", False))
    except Exception:  # noqa: BLE001 - another Lightning version: log at every batch
        return True


def _callbacks(trainer: pl.Trainer) -> list[pl.Callback]:
    """The Trainer's callbacks (an attribute its connector sets: not in its type)."""
    found: list[pl.Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return found


class _RescaleBeforeClip:
    """Observer listener (manual optimisation, ``exact=True``): the first clipping call of
    a window that has run backwards rescales the gradient before the clip reads its norm;
    ``on_before_optimizer_step`` then leaves it alone. A clip inside the window (F8, a bug
    the checks report) would rescale on an incomplete count."""

    def __init__(self, callback: AccumguardCallback, trainer: pl.Trainer,
                 pl_module: pl.LightningModule) -> None:
        self._cb, self._trainer, self._module = callback, trainer, pl_module

    def on_clip(self, event: ClipEvent) -> None:
        cb, obs = self._cb, self._cb._clip_obs
        if obs is not None and event.micro > 0 and cb._scaled_after != obs.backward_total:
            cb._rescale(self._trainer, self._module)
            cb._scaled_after = obs.backward_total
