"""transformers ``Trainer``: an exact, checked loss for ``compute_loss`` overrides, and a callback.

The one-line change in a ``compute_loss`` override::

    loss = exact_token_loss(self, outputs.logits, inputs["labels"], num_items_in_batch)

and the checks: ``Trainer(..., callbacks=[AccumguardCallback()])``.

Why: the Trainer prefetches each window of ``gradient_accumulation_steps``
micro-batches and passes their token count (over all ranks when
``average_tokens_across_devices``) as ``num_items_in_batch``; it then does *not*
divide the loss by K. An override that returns a per-micro-batch token mean and
ignores ``num_items_in_batch`` therefore trains on a sum of means (F5, and K× too
large); one that sets ``loss_is_scaled_for_ga = False`` gets the mean of means / K
(F5). :func:`exact_token_loss` returns ``Σ token losses / num_items_in_batch``,
times the world size when the count is global (DDP averages the ranks), and
refuses the configurations in which that cannot be exact.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from accumguard.core.errors import AccumguardWarning, ConfigError, MissingDependencyError
from accumguard.integrations._checks import (
    DEFAULT_EVERY_N_STEPS,
    AccumulationChecks,
    Finding,
    _finding,
    callback_dict,
    safe_callback,
)
from accumguard.integrations._figures import PREFIX
from accumguard.observe import Patches
from accumguard.observe._failsafe import Original

if TYPE_CHECKING:
    from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("transformers", "transformers",
                                 "accumguard.integrations.transformers") from err

__all__ = ["AccumguardCallback", "exact_token_loss"]


def exact_token_loss(trainer: Trainer, logits: torch.Tensor, labels: torch.Tensor,
                     num_items_in_batch: torch.Tensor | int | None, *,
                     shift_labels: bool = True, ignore_index: int = -100,
                     strict: bool = True) -> torch.Tensor:
    """This micro-batch's share of the window's exact token-mean cross-entropy.

    ``Σ_valid CE / num_items_in_batch`` (× world size when the Trainer counted tokens over
    all ranks), so that after the Trainer's K backwards and DDP's average the optimizer
    receives the mean over every valid token of the window. ``shift_labels`` (causal LMs,
    the default) predicts ``labels[t+1]`` from ``logits[t]``; False for aligned labels.

    Raises :class:`~accumguard.core.errors.ConfigError` when the Trainer did not pass
    ``num_items_in_batch`` (it counts tokens only when the model's ``forward`` takes
    ``**kwargs`` or a ``compute_loss_func`` is set), when ``loss_is_scaled_for_ga`` is
    False (the Trainer would divide by K again), when ranks count tokens locally
    (``average_tokens_across_devices=False`` on several ranks: F6), or when the shift
    differs from the positions the Trainer counted (``model.loss_type`` decides them:
    transformers 5 counts all labels for a model whose class name does not end in
    ``ForCausalLM``, e.g. ``GPT2LMHeadModel``, while its loss shifts). ``strict=False`` turns the missing count into an
    :class:`~accumguard.core.errors.AccumguardWarning` and returns the per-micro-batch
    mean (the Trainer then divides it by K: F5 with uneven counts).
    """
    if getattr(trainer, "loss_is_scaled_for_ga", None) is False:
        raise ConfigError(
            "trainer.loss_is_scaled_for_ga is False, so the Trainer divides the loss by "
            "gradient_accumulation_steps after compute_loss; exact_token_loss already "
            "normalises by the window's token count. Set loss_is_scaled_for_ga = True (or "
            "leave it None) in your Trainer subclass")
    shifts = getattr(trainer, "_loss_shifts_labels", None)
    if shifts is not None and bool(shifts) != shift_labels:
        how = "over labels[..., 1:]" if shifts else "over all labels, position 0 of each row included"
        fix = ("the Trainer decides from model.loss_type: set model.loss_type = 'ForCausalLM' "
               "before building the Trainer (e.g. GPT2LMHeadModel has loss_type None, so the "
               "Trainer counts one token per row too many while the model's loss shifts)"
               if shift_labels else "pass shift_labels=True")
        raise ConfigError(
            f"shift_labels={shift_labels}, but the Trainer counted num_items_in_batch {how}; "
            f"the count would not match the loss's tokens. Fix: {fix}")
    if shift_labels:
        logits, labels = logits[..., :-1, :], labels[..., 1:]
    labels = labels.to(logits.device)
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                            ignore_index=ignore_index, reduction="sum")
    if num_items_in_batch is None:
        why = (
            "the Trainer did not pass num_items_in_batch: it counts a window's tokens only when "
            "the batch has 'labels' and the model's forward accepts **kwargs "
            f"(trainer.model_accepts_loss_kwargs={getattr(trainer, 'model_accepts_loss_kwargs', None)}) "
            "or a compute_loss_func is given. Without the count the loss cannot be normalised by "
            "the window's tokens. Fix: set self.model_accepts_loss_kwargs = True in your Trainer "
            "subclass's __init__ (your compute_loss receives the count; pass it here, not to the "
            "model)")
        if strict:
            raise ConfigError(why)
        warnings.warn(f"accumguard: {why}; falling back to the per-micro-batch mean (F5 on uneven "
                      "token counts)", AccumguardWarning, stacklevel=2)
        return total / (labels != ignore_index).sum().clamp(min=1)
    args = trainer.args
    world = int(getattr(args, "world_size", 1))
    if world > 1 and not getattr(args, "average_tokens_across_devices", False):
        raise ConfigError(
            f"average_tokens_across_devices=False on {world} ranks: num_items_in_batch counts "
            "only this rank's tokens, and DDP then averages rank-local means (F6 when ranks "
            "hold different token counts). Set TrainingArguments(average_tokens_across_devices"
            "=True)")
    if not logits.is_cuda:  # a cheap sanity check where it costs no device sync
        local = int((labels != ignore_index).sum())
        if local > float(num_items_in_batch):
            raise ConfigError(
                f"this micro-batch alone has {local} valid tokens but num_items_in_batch is "
                f"{float(num_items_in_batch):g}; the count does not cover the loss's tokens "
                "(check shift_labels and ignore_index)")
    scale = world if world > 1 else 1
    return total * scale / num_items_in_batch


def _no_count_hint(model: torch.nn.Module, args: TrainingArguments) -> str:
    """Why the loss may be a per-micro-batch mean: the model declares that its forward takes
    no loss kwargs (transformers then counts no ``num_items_in_batch``). Said beside the
    "token weights not judged" note, as a condition to check, not a finding."""
    base: object = model
    for attr in ("get_base_model",):  # a PEFT model: the Trainer reads the base model's flag
        getter = getattr(base, attr, None)
        if callable(getter):
            base = getter()
    if getattr(base, "accepts_loss_kwargs", None) is not False:
        return ""
    if int(getattr(args, "gradient_accumulation_steps", 1)) <= 1:
        return ""
    return ("Note: the model sets accepts_loss_kwargs = False, so the Trainer counts no "
            "num_items_in_batch and divides the loss by gradient_accumulation_steps: a loss "
            "that would normalise by that count (the Trainer's own; TRL's SFTTrainer, whose "
            "loss is computed outside the model) is then each micro-batch's token mean / K, "
            "F5 when token counts differ. With TRL's SFTTrainer set "
            "trainer.model_accepts_loss_kwargs = True after building it; check the run with "
            "`accumguard invariance --ks 1,4 -- ...`.")


def _unasked_deepspeed_clip(args: TrainingArguments) -> float | None:
    """DeepSpeed's default clip when the Trainer runs DeepSpeed with a config that leaves
    ``gradient_clipping`` out (the Trainer then neither fills it nor clips itself) and
    ``max_grad_norm`` asks for something else; None otherwise."""
    hf_ds = getattr(args, "hf_deepspeed_config", None)
    config = getattr(hf_ds, "config", None)
    if not isinstance(config, dict) or "gradient_clipping" in config:
        return None
    try:
        from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    except ImportError:
        return None
    default = float(GRADIENT_CLIPPING_DEFAULT)
    return default if default > 0 and float(args.max_grad_norm) != default else None


#: The fix of each class in the Trainer's terms (appended to the generic one).
FIX_HINTS = {
    "F5": "In a compute_loss override: return exact_token_loss(self, outputs.logits, "
          "inputs['labels'], num_items_in_batch) (the summed token loss divided by "
          "num_items_in_batch, x world size); the Trainer does not divide by K itself.",
    "LOSS_SCALE": "In a compute_loss override: divide the summed token loss by "
                  "num_items_in_batch (exact_token_loss), not by K or a local count.",
    "F10": "When num_items_in_batch counts every rank's tokens, multiply by the number of "
           "processes (DDP averages the ranks): exact_token_loss does.",
    "F6": "Set TrainingArguments(average_tokens_across_devices=True) and divide by "
          "num_items_in_batch.",
    "F9": 'Under DeepSpeed the Trainer leaves clipping to the engine: put "gradient_clipping": '
          '"auto" in the DeepSpeed config (the Trainer fills in max_grad_norm).',
}


class AccumguardCallback(TrainerCallback):
    """Runs the accumulation checks inside a ``Trainer``.

    Findings (F5 for a token mean that ignores ``num_items_in_batch``, F4 for a scheduler
    stepped more than once per optimizer step, ...) are logged (logger ``accumguard``),
    stored as dicts in ``trainer.state.accumguard_findings``, and appended to
    ``trainer.state.log_history`` as ``{"step": ..., "accumguard": [...]}``. ``strict=True`` raises
    :class:`~accumguard.core.errors.AccumulationError` at the first finding.

    The findings and the last checked step's figures (``accumguard/backwards``,
    ``accumguard/conservation_error``, ``accumguard/token_weight_error``, ...: see
    :mod:`accumguard.integrations._figures`) go into the Trainer's next ``logs`` dict, so
    every ``report_to`` integration (TensorBoard, W&B, MLflow...) records them: the Trainer
    calls the reporting callbacks before the ones you add, so the keys are added when the
    Trainer dispatches ``on_log`` (a fail-safe wrapper of ``CallbackHandler.on_log`` while
    training, for the Trainers that hold this callback only).
    """

    def __init__(self, *, strict: bool = False, every_n_steps: int = DEFAULT_EVERY_N_STEPS,
                 logits_module: torch.nn.Module | None = None) -> None:
        self.strict = strict
        self.every_n_steps = every_n_steps
        self.logits_module = logits_module
        self.checks: AccumulationChecks | None = None
        self.findings: list[Finding] = []
        self._reported = 0
        self._logged = 0  # findings already put into a logs dict
        self._figures: dict[str, float] = {}  # not yet logged
        self._patches: Patches | None = None
        self._ds_clip: float | None = None  # DeepSpeed's default clip the Trainer did not ask

    @safe_callback
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: torch.nn.Module | None = None,
                       optimizer: torch.optim.Optimizer | None = None,
                       lr_scheduler: object = None, **kwargs: object) -> None:
        if model is None or optimizer is None:
            raise ConfigError("AccumguardCallback needs the Trainer's model and optimizer at "
                              "on_train_begin; add it through Trainer(callbacks=[...])")
        self.checks = AccumulationChecks(
            model, optimizer, accumulation_steps=int(args.gradient_accumulation_steps),
            scheduler=lr_scheduler, averages_over_ranks=int(args.world_size) > 1,
            logits_module=self.logits_module, every_n_steps=self.every_n_steps,
            strict=self.strict, on_finding=self.findings.append, fix_hints=FIX_HINTS)
        _publish(state, [])
        self.checks.not_judged_hint = _no_count_hint(model, args)
        self._ds_clip = _unasked_deepspeed_clip(args)
        self._hook_logs()

    @safe_callback
    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: object) -> None:
        """F9 under DeepSpeed: the engine clips at its default while ``max_grad_norm`` asked
        for other clipping, and the Trainer's logged (pre-clip) ``grad_norm`` exceeded it."""
        norm = logs.get("grad_norm") if isinstance(logs, dict) else None
        clip = self._ds_clip
        if clip is None or self.checks is None or not isinstance(norm, (int, float)):
            return
        if norm > clip * (1 + 1e-6):
            self._ds_clip = None  # said once
            asked = float(args.max_grad_norm)
            self.checks._report(_finding(
                int(state.global_step) - 1, "F9",
                f"the DeepSpeed config does not set gradient_clipping, so the engine clips at "
                f"its default {clip:g} while TrainingArguments(max_grad_norm={asked:g}) asked "
                f"for {'no clipping' if asked <= 0 else f'clipping at {asked:g}'}; the "
                f"Trainer's logged gradient norm was {norm:.4g} at step {state.global_step}: "
                "that update was shrunk"))

    def _hook_logs(self) -> None:
        """Add the pending figures to the ``logs`` dict before any callback sees it."""
        from transformers.trainer_callback import CallbackHandler

        assert self.checks is not None
        self._patches = Patches(self.checks.failsafe)

        def make(orig: Original) -> Original:
            def on_log(handler: CallbackHandler, /, *args: object, **kwargs: object) -> object:
                logs = kwargs.get("logs", args[3] if len(args) > 3 else None)
                if isinstance(logs, dict) and any(cb is self for cb in handler.callbacks):
                    logs.update(self.log_entries())
                return orig(handler, *args, **kwargs)

            return on_log

        self._patches.wrap(CallbackHandler, "on_log", make)

    def log_entries(self) -> dict[str, float | str]:
        """The figures and findings not yet logged (then marked logged)."""
        out: dict[str, float | str] = {PREFIX + k: v for k, v in self._figures.items()}
        self._figures = {}
        new = self.findings[self._logged:]
        self._logged = len(self.findings)
        if out or new:  # (a log with nothing new, e.g. the closing summary, gets nothing)
            out[PREFIX + "findings"] = float(len(self.findings))
        if new:
            out[PREFIX + "finding"] = "\n".join(f"step {f.step}: {f.class_id} {f.title}: "
                                                f"{f.evidence}" for f in new)
        return out

    @safe_callback
    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: object) -> None:
        if self.checks is not None and self.checks.figures:
            self._figures.update(self.checks.figures)
            self.checks.figures = {}
        new = self.findings[self._reported:]
        self._reported = len(self.findings)
        if new:  # into the Trainer's own log history, next to its loss records (a list
            # of names where its declared type says float: the history is JSON, not figures)
            state.log_history.append({
                "step": state.global_step,
                "accumguard": [f"{f.class_id}: {f.title}" for f in new]})  # type: ignore[dict-item]
        _publish(state, [callback_dict(f) for f in self.findings])

    @safe_callback
    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: object) -> None:
        if self.checks is not None:
            self.checks.close()
            self.checks = None
        if self._patches is not None:  # (the Trainer's closing log has run: it precedes this)
            self._patches.undo()
            self._patches = None
        _publish(state, [callback_dict(f) for f in self.findings])


def _publish(state: TrainerState, findings: list[dict[str, object]]) -> None:
    """``trainer.state.accumguard_findings``: an attribute accumguard adds to the Trainer's
    state (not one of its declared fields)."""
    state.accumguard_findings = findings  # type: ignore[attr-defined]
