"""The accumulation checks' one-time information lines (logger ``accumguard``, rank 0, never
findings): what the checks could not judge and why, and Accelerate's scheduler convention.
A mixin of :class:`accumguard.integrations._checks.AccumulationChecks` (its ``rank``,
``probe`` and ``not_judged_hint`` are read here)."""

from __future__ import annotations

import logging

from accumguard.observe.tokens import TokenWeightProbe

__all__ = ["InfoNotes"]

log = logging.getLogger("accumguard")


class InfoNotes:
    """Each note is said once per run."""

    rank: int
    probe: TokenWeightProbe
    #: a sentence the framework's callback appends to "not judged" notes (e.g. the HF
    #: Trainer's: why its loss may not be normalised over the window)
    not_judged_hint: str = ""
    _said_sched_w = False
    _said_mixed = False
    _said_not_ce = False
    _said_no_logits = False

    def _say_wrapper_steps(self, n: int) -> None:
        if not self._said_sched_w and self.rank == 0:
            log.info("accumguard: Accelerate's prepared scheduler advances its schedule %d "
                     "times per optimizer step (num_processes, split_batches=False), by "
                     "Accelerate's design: right when the schedule's length counts batches "
                     "of the unprepared dataloader; if you computed it from the prepared "
                     "dataloader (or from optimizer steps), the schedule runs %dx ahead", n, n)
        self._said_sched_w = True

    def _boundary_mixed(self, step: int) -> None:
        """Between the last backward and the step the gradient changed by more than one
        scale (a hand-written all-reduce, weight decay added to .grad): the weights the
        optimizer received are not the probe's times one number. Said once (info)."""
        if not self._said_mixed and self.rank == 0:
            log.info("accumguard step %d: between the last backward and the optimizer step "
                     "the gradient changed by more than one scale (e.g. a hand-written "
                     "all-reduce, weight decay added to .grad): token weights are not judged "
                     "on such steps", step + 1)
        self._said_mixed = True

    def _not_cross_entropy(self, step: int) -> None:
        """The probed module's gradient is not a token cross-entropy's: the token weights
        cannot be read from it. Said once (info), never a finding."""
        if not self._said_not_ce and self.rank == 0:
            log.info("accumguard step %d: the gradient of %s is not that of a token "
                     "cross-entropy alone on its output, with or without label smoothing (another "
                     "loss term on the logits, logits scaled after the layer, a hidden layer taken for the "
                     "logits, e.g. with tied embeddings; a regression head): token "
                     "weights are not judged. When the layer is the wrong one, pass "
                     "logits_module=<the layer whose output the cross-entropy reads>",
                     step + 1, type(self.probe._module).__name__)
        self._said_not_ce = True

    def _no_logits(self, step: int) -> None:
        """A checked window whose backwards never went through the probed logits layer (TRL's
        fused LM head computes log-probs from ``lm_head.weight`` without calling the module;
        a loss on hidden states): token weights cannot be read. Said once (info)."""
        if not self._said_no_logits and self.rank == 0:
            log.info("accumguard step %d: no gradient reached the output of %s in this window "
                     "(the loss does not go through that module, e.g. TRL's fused LM head, "
                     "which reads lm_head.weight directly): token weights are not judged "
                     "(F5/F6/F10/F7 not checked); the boundary checks still run.%s", step + 1,
                     type(self.probe._module).__name__,
                     f" {self.not_judged_hint}" if self.not_judged_hint else "")
        self._said_no_logits = True

