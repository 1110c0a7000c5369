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
from typing import Any

import torch
import torch.nn.functional as F

from accumguard.core.errors import AccumguardWarning, ConfigError, MissingDependencyError
from accumguard.integrations._checks import (
    DEFAULT_EVERY_N_STEPS,
    AccumulationChecks,
    Finding,
    safe_callback,
)

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("transformers", "transformers",
                                 "accumguard.integrations.transformers") from err

__all__ = ["AccumguardCallback", "exact_token_loss"]


def exact_token_loss(trainer: Any, logits: torch.Tensor, labels: torch.Tensor,
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
}


class AccumguardCallback(TrainerCallback):
    """Runs the accumulation checks inside a ``Trainer``.

    Findings (F5 for a token mean that ignores ``num_items_in_batch``, F4 for a scheduler
    stepped more than once per optimizer step, ...) are logged (logger ``accumguard``),
    stored as dicts in ``trainer.state.accumguard_findings``, and appended to
    ``trainer.state.log_history`` as ``{"step": ..., "accumguard": [...]}``. ``strict=True`` raises
    :class:`~accumguard.core.errors.AccumulationError` at the first finding.
    """

    def __init__(self, *, strict: bool = False, every_n_steps: int = DEFAULT_EVERY_N_STEPS,
                 logits_module: torch.nn.Module | None = None) -> None:
        self.strict = strict
        self.every_n_steps = every_n_steps
        self.logits_module = logits_module
        self.checks: AccumulationChecks | None = None
        self.findings: list[Finding] = []
        self._reported = 0

    @safe_callback
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> None:
        if model is None or optimizer is None:
            raise ConfigError("AccumguardCallback needs the Trainer's model and optimizer at "
                              "on_train_begin; add it through Trainer(callbacks=[...])")
        self.checks = AccumulationChecks(
            model, optimizer, accumulation_steps=int(args.gradient_accumulation_steps),
            scheduler=lr_scheduler, averages_over_ranks=int(args.world_size) > 1,
            logits_module=self.logits_module, every_n_steps=self.every_n_steps,
            strict=self.strict, on_finding=self.findings.append, fix_hints=FIX_HINTS)
        state.accumguard_findings = []

    @safe_callback
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        new = self.findings[self._reported:]
        self._reported = len(self.findings)
        if new:  # into the Trainer's own log history, next to its loss records
            state.log_history.append({"step": state.global_step,
                                      "accumguard": [f"{f.class_id}: {f.title}" for f in new]})
        state.accumguard_findings = [f.as_dict() for f in self.findings]

    @safe_callback
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.checks is not None:
            self.checks.close()
            self.checks = None
        state.accumguard_findings = [f.as_dict() for f in self.findings]
