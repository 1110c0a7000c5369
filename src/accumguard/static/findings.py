"""The rule catalogue, and how a static check makes its finding.

Both halves of the static tooling — the script linter (``accumguard lint``,
codes ``AG1xx``, then ``AG3xx`` once AG199 is taken) and the DeepSpeed config checker
(``accumguard check-config``,
codes ``AG2xx``) — report :class:`~accumguard.core.findings.Finding` objects (the
one finding type of accumguard, re-exported here with its ``Severity`` and
``Confidence``), made by :func:`lint_finding` from the rule's code, so that one set of
formatters (text, JSON, SARIF) and one exit-code policy serve both. Codes are
stable: a code is never reused for a different meaning, because users pin them
in ``--select``/``--ignore`` and in ``# accumguard: ignore[CODE]`` comments.

This module is imported by :mod:`accumguard.static.dsconfig`, which the DeepSpeed
engine adapter imports at construction time, so it must stay stdlib-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from accumguard.core import taxonomy
from accumguard.core.findings import Confidence, Finding, Severity

__all__ = ["RULES", "Confidence", "Finding", "Rule", "Severity", "filter_findings", "lint_finding",
           "rule_matches"]


@dataclass(frozen=True)
class Rule:
    """One check: its stable code, the failure class it detects, and the canonical fix."""

    code: str
    name: str
    failure_class: str
    severity: Severity
    confidence: Confidence
    summary: str
    fix: str

    @property
    def class_title(self) -> str:
        """The failure class's one-line name, from :mod:`accumguard.core.taxonomy` ("" if none)."""
        return taxonomy.title(self.failure_class) if self.failure_class else ""


def lint_finding(code: str, message: str, *, fix: str | None = None,
                 severity: Severity | None = None, confidence: Confidence | None = None,
                 key: str | None = None, line: int | None = None, col: int | None = None,
                 path: str | None = None, end_line: int | None = None,
                 end_col: int | None = None) -> Finding:
    """The :class:`~accumguard.core.findings.Finding` of rule ``code``: its failure class,
    the class's title (the rule's name when it has no class), and the rule's fix, severity
    and confidence unless the check gives its own; ``message`` is what the check read.
    ``line``/``col`` are 1-based and ``None`` when unknown (e.g. a config key that is
    *missing*); ``key`` is the dotted config key path of a config finding."""
    rule = RULES[code]
    return Finding(rule.failure_class, severity or rule.severity, None, None, None, message,
                   rule.fix if fix is None else fix, rule.class_title or rule.name, code=code,
                   path=path, line=line, col=col, end_line=end_line, end_col=end_col, key=key,
                   confidence=confidence or rule.confidence)


def _rule(
    code: str,
    name: str,
    failure_class: str,
    severity: Severity,
    confidence: Confidence,
    summary: str,
    fix: str,
) -> Rule:
    return Rule(code, name, failure_class, severity, confidence, summary, fix)


E, W, N = Severity.ERROR, Severity.WARNING, Severity.NOTE
HI, MED, LO = Confidence.HIGH, Confidence.MEDIUM, Confidence.LOW

#: Every rule, by code. ``docs/rules.md`` documents each with a wrong and a right example.
RULES: dict[str, Rule] = {
    r.code: r
    for r in (
        # ---- script rules (accumguard lint) ----
        _rule(
            "AG101", "step-every-micro-step", "F1", E, HI,
            "optimizer step() inside the micro-batch loop without an accumulation-boundary condition",
            "guard the step (and zero_grad/scheduler/clip with it) with the boundary, e.g. "
            "`if (i + 1) % accum_steps == 0:`, or move it after the micro-batch loop",
        ),
        _rule(
            "AG102", "zero-grad-in-window", "F3", E, HI,
            "zero_grad() inside the accumulation window erases the gradients of the earlier micro-batches",
            "call zero_grad() only at the boundary, right after the optimizer step "
            "(or before the first micro-batch of a window)",
        ),
        _rule(
            "AG103", "scheduler-every-micro-step", "F4", E, HI,
            "LR scheduler step() on every micro-step runs the schedule K times too fast",
            "step the scheduler next to the optimizer step, under the same boundary condition",
        ),
        _rule(
            "AG104", "mean-of-means-loss", "F5", W, MED,
            "loss divided by the accumulation steps while the loss is a mean over a variable number "
            "of tokens (padding/ignore_index in sight): this averages per-micro-batch means",
            "sum the per-token loss (reduction='sum') and divide by the number of valid tokens of the "
            "whole window, counted over all micro-batches (and ranks) before the first backward",
        ),
        _rule(
            "AG105", "clip-in-window", "F8", E, HI,
            "gradient clipping / unscale_ inside the accumulation window acts on a partial gradient",
            "unscale and clip once, at the boundary, right before the optimizer step "
            "(e.g. under `if accelerator.sync_gradients:`)",
        ),
        _rule(
            "AG106", "sync-flag-after-forward", "F11", E, HI,
            "DDP decides at forward time whether the backward all-reduces: require_backward_grad_sync "
            "set after the forward acts one micro-step late, so the last micro-step of the window "
            "(whose forward saw the previous micro-step's False) is not all-reduced",
            "set require_backward_grad_sync (or enter `with model.no_sync():`) before the forward, "
            "so it spans forward and backward",
        ),
        _rule(
            "AG107", "all-reduce-sum-no-average", "F10", E, MED,
            "gradients all-reduced with SUM and never divided by the world size: the optimizer "
            "gets W times the gradient",
            "use op=ReduceOp.AVG, or divide the gradients by dist.get_world_size() after the all-reduce",
        ),
        _rule(
            "AG108", "double-average", "F10", W, MED,
            "gradients reduced or divided by the world size by hand while the model is wrapped in "
            "DDP/FSDP, which already averages them",
            "drop the manual reduction (DDP already averaged), or drop DDP and keep exactly one average",
        ),
        _rule(
            "AG109", "deepspeed-config-ga-1", "F2", E, HI,
            "DeepSpeed engine driven with K backwards per step() while its config has "
            "gradient_accumulation_steps 1 (or absent): ZeRO-1/2 keep only the last micro-batch",
            "set gradient_accumulation_steps to K in the config and call engine.backward()/engine.step() "
            "on every micro-batch (the engine gates the step), or wrap the K backwards in "
            "`with engine.coalesce_grad_reduction():`",
        ),
        _rule(
            "AG110", "deepspeed-double-gating", "F14", E, MED,
            "engine.step() gated by hand while the DeepSpeed config also accumulates: the engine "
            "counts one micro-step per step() call, so it steps every K x GA micro-batches",
            "let the engine gate: call engine.step() after every engine.backward() and drop the manual "
            "boundary condition",
        ),
        _rule(
            "AG111", "sync-flag-polarity", "F11", E, HI,
            "gradient sync flag (FSDP2 set_requires_gradient_sync / DDP require_backward_grad_sync) "
            "inverted, or switched off and never switched back on",
            "sync on the last micro-step of each window only: "
            "`model.set_requires_gradient_sync(is_last)` before its forward, with "
            "`is_last = (i + 1) % K == 0`",
        ),
        _rule(
            "AG112", "loss-divided-by-world", "F10", E, MED,
            "loss divided by the world size before backward under DDP/FSDP, which already averages "
            "over ranks",
            "drop the division by the world size: DDP/FSDP average the gradients over ranks already",
        ),
        _rule(
            "AG113", "rank-local-token-mean", "F6", W, MED,
            "loss normalised by this rank's own token count under DDP/FSDP: DDP averages "
            "rank-local means",
            "all-reduce the window's token count once (dist.all_reduce(n_tokens)) and scale the "
            "summed loss by world_size / n_tokens_global",
        ),
        _rule(
            "AG114", "scheduler-per-process", "F4", E, HI,
            "LR scheduler stepped once per process for each optimizer step: the schedule runs "
            "W times ahead",
            "step the scheduler once per optimizer step on every rank (each rank owns its scheduler); "
            "size the schedule in optimizer steps",
        ),
        _rule(
            "AG119", "scheduler-in-micro-step-hook", "F4", E, HI,
            "LR scheduler stepped in a framework hook that runs on every micro-batch (Hugging Face "
            "TrainerCallback.on_substep_end; Lightning on_train_batch_end / on_after_backward with "
            "accumulate_grad_batches > 1): the schedule advances per micro-batch, not per optimizer step",
            "step the scheduler in a hook that runs once per optimizer step (HF on_step_end or "
            "on_optimizer_step; Lightning on_before_optimizer_step / optimizer_step), or let the "
            "Trainer step it (HF lr_scheduler_type, Lightning configure_optimizers with "
            "interval='step')",
        ),
        _rule(
            "AG120", "low-precision-model-accumulation", "F12", W, MED,
            "the model itself is cast to bf16/fp16 (`.to(torch.bfloat16)`, `.half()`) and its "
            "gradients are accumulated over K > 1 micro-batches: every micro-batch is added into a "
            "bf16/fp16 .grad, whose rounding error grows with K",
            "keep the parameters in fp32 and run the forward under torch.autocast (the .grad buffers "
            "stay fp32), or accumulate into fp32 copies of the gradients (master weights)",
        ),
        _rule(
            "AG115", "boundary-counter-off-by-one", "F13", E, HI,
            "the step is gated by a micro-batch counter compared off by one (`i % K == 0` with i "
            "counting from 0, the step after the backward): the first window has 1 (or K+1) "
            "micro-batches instead of K",
            "test the counter after it counts this micro-batch: `if (i + 1) % K == 0:` for a counter "
            "from 0 (enumerate/range), or increment it before the test",
        ),
        _rule(
            "AG116", "sync-every-micro-step", "", N, HI,
            "DDP's sync is switched off only after the forward (no_sync() around the backward alone, "
            "or require_backward_grad_sync turned off after the forward): correct, but every "
            "micro-step still all-reduces",
            "put the forward inside `with model.no_sync():` (or set require_backward_grad_sync "
            "before the forward) to save K-1 all-reduces per optimizer step",
        ),
        _rule(
            "AG117", "partial-window-leak", "F7", W, MED,
            "the step is gated by a per-epoch counter (`(i + 1) % K == 0`) and nothing steps or clears "
            "the gradients after the epoch's loop: the last len % K micro-batches of an epoch are "
            "added to the next epoch's first window",
            "step on the final partial window too (`if (i + 1) % K == 0 or i + 1 == len(loader):`, "
            "its loss normalised by its own size), or drop it with optimizer.zero_grad() after the "
            "loop; a counter that runs across epochs keeps every window at K micro-batches",
        ),
        _rule(
            "AG118", "hf-compute-loss-mean", "F5", E, MED,
            "a Hugging Face Trainer subclass's compute_loss returns a per-micro-batch mean loss and "
            "never uses num_items_in_batch while gradient accumulation is on: a mean of means (and, "
            "when transformers counts the loss as normalised, K times the gradient)",
            "sum the per-token loss (reduction='sum') and divide by num_items_in_batch when it is "
            "given; or pass num_items_in_batch to the model (model(**inputs, "
            "num_items_in_batch=num_items_in_batch)) and return its loss; or call "
            "super().compute_loss(model, inputs, return_outputs, num_items_in_batch)",
        ),
        _rule(
            "AG121", "accelerate-loss-divided-twice", "LOSS_SCALE", E, HI,
            "the loss is divided by the number of accumulation steps before accelerator.backward() "
            "while the Accelerator has gradient_accumulation_steps > 1: backward() divides by it "
            "again, so the gradient is G / K",
            "pass the undivided loss to accelerator.backward(loss): it divides by "
            "gradient_accumulation_steps itself",
        ),
        _rule(
            "AG122", "mean-loss-not-divided-by-k", "LOSS_SCALE", E, MED,
            "a hand-written accumulation window backwards each micro-batch's mean loss as is and "
            "nothing divides by K: the window's gradient is K times the large batch's mean",
            "divide the loss by K before backward() (loss / K), or by the window's count of "
            "samples/tokens when micro-batches differ in size",
        ),
        _rule(
            "AG123", "global-count-then-ddp-average", "F10", E, MED,
            "the loss is divided by a count summed over every rank (all_reduce) while DDP/FSDP "
            "averages the gradients over the W ranks too: the optimizer receives G / W",
            "multiply the loss by the world size, or divide by the count's rank share "
            "(global_count / world_size)",
        ),
        _rule(
            "AG124", "schedule-horizon-in-micro-batches", "F4", E, MED,
            "the LR schedule's horizon counts micro-batches (`len(loader)` with no division by K) "
            "while the scheduler steps once per optimizer step: the schedule is K times too long "
            "and never reaches its end",
            "size the horizon in optimizer steps: `math.ceil(len(loader) / K) * epochs` (or step "
            "the scheduler on every micro-batch only if that is what the horizon means)",
        ),
        _rule(
            "AG125", "accelerate-horizon-per-process", "F4", E, MED,
            "an Accelerate-prepared scheduler's horizon is divided by the number of processes, but "
            "the prepared scheduler advances num_processes times per optimizer step: the schedule "
            "ends W times early",
            "multiply the horizon by accelerator.num_processes (Accelerate's own examples pass "
            "`max_train_steps * accelerator.num_processes`), or build the Accelerator with "
            "step_scheduler_with_optimizer=False and step the scheduler yourself",
        ),
        _rule(
            "AG126", "fsdp2-low-precision-reduce", "F12", W, MED,
            "FSDP2 MixedPrecisionPolicy with a bf16/fp16 param_dtype and reduce_dtype bf16/fp16 (or "
            "unset) while the gradient sync is deferred over K > 1 micro-batches: the window's "
            "unsharded gradient is summed in bf16/fp16, a drift growing with K (an error from K >= 4)",
            "pass reduce_dtype=torch.float32 to MixedPrecisionPolicy: FSDP2 then accumulates the "
            "window's unsharded gradient and reduces it in fp32",
        ),
        _rule(
            "AG127", "loss-term-not-divided-by-k", "LOSS_SCALE", E, MED,
            "in a hand-written accumulation window one term of the loss is divided by K and another "
            "(an auxiliary, router, z-loss or regulariser term) is added undivided: over K "
            "micro-batches that term weighs K times its coefficient",
            "divide the whole sum by K — `loss = (ce + aux_coef * aux) / K` — or each term alike",
        ),
        _rule(
            "AG128", "accelerator-k-without-accumulate", "F1", E, HI,
            "the Accelerator has gradient_accumulation_steps > 1 but the loop never enters "
            "accelerator.accumulate(model): the prepared optimizer steps after every batch, on "
            "1/K of its gradient",
            "wrap each micro-step in `with accelerator.accumulate(model):` (forward, "
            "accelerator.backward, optimizer.step, optimizer.zero_grad inside it): Accelerate "
            "then steps once per K batches",
        ),
        _rule(
            "AG137", "optimizer-in-backward-accumulating", "F1", E, MED,
            "an optimizer steps in a register_post_accumulate_grad_hook (optimizer fused into "
            "backward) while the loop runs several backwards per optimizer step: the hook steps "
            "after every backward, on each micro-batch's gradient alone",
            "with accumulation, step outside the hook once per window (`if (i + 1) % K == 0: "
            "opt.step(); opt.zero_grad()`), or gate the hook on a boundary flag the loop sets on "
            "the window's last micro-batch; or run one backward per step",
        ),
        _rule(
            "AG138", "clip-in-lightning-backward-hook", "F8", E, HI,
            "gradient clipping in a LightningModule's on_after_backward / on_before_backward while "
            "the Trainer accumulates (accumulate_grad_batches > 1), or in a Hugging Face "
            "TrainerCallback's on_substep_end, or a parameter's tensor hook (p.register_hook) that "
            "clamps its gradient: the hook runs on every micro-batch, so the partial sum (or each "
            "micro-batch's own gradient) is clipped instead of the window's gradient once",
            "clip once per optimizer step: Trainer(gradient_clip_val=...), or clip in "
            "configure_gradient_clipping / on_before_optimizer_step",
        ),
        _rule(
            "AG139", "deepspeed-hand-gated-config-unseen", "F14", W, MED,
            "engine.step() once per several engine.backward() calls while the DeepSpeed config "
            "comes from the command line: wrong with gradient_accumulation_steps = K (double "
            "gating) and with GA 1 on ZeRO-1/2 (each backward a boundary); right only with GA 1 on "
            "ZeRO-0/3 or managed_gradient_accumulation false",
            "let the engine gate: call engine.step() after every engine.backward(loss) (no / K, "
            "the engine scales by 1/GA) and set \"gradient_accumulation_steps\": K in the config",
        ),
        _rule(
            "AG140", "hf-tokens-not-averaged-across-devices", "F6", W, MED,
            "Hugging Face TrainingArguments(average_tokens_across_devices=False): on several "
            "processes each rank divides its loss by its own token count (num_items_in_batch "
            "counts this rank's tokens) and DDP then averages the ranks' means, so ranks with "
            "fewer tokens weigh more",
            "set average_tokens_across_devices=True (the default): the Trainer then counts "
            "num_items_in_batch over every rank and scales the loss so that DDP's average is "
            "the whole batch's token mean",
        ),
        _rule(
            "AG141", "tail-window-divided-by-k", "F7", W, MED,
            "the step also runs on the pass's last, partial window (`or i + 1 == len(loader)`) "
            "while every micro-step's loss is divided by K: that window's r < K micro-batches "
            "reach the optimizer as r/K of their mean gradient",
            "divide each micro-step's loss by the size of its own window, `min(K, len(loader) - "
            "start)` with `start = (i // K) * K` (or by the window's sample/token count)",
        ),
        _rule(
            "AG129", "masked-token-mean-not-divided-by-k", "LOSS_SCALE", E, MED,
            "in a hand-written accumulation window each micro-batch's loss is a masked token mean "
            "over its own tokens (`(x * mask).sum() / mask.sum()`) backwarded as is, and nothing "
            "divides by K: the optimizer receives K times the mean gradient, short micro-batches "
            "over-weighted",
            "count the window's valid tokens once before its first backward and divide each "
            "micro-batch's masked sum by that count — `(x * mask).sum() / window_tokens` "
            "(all-reduce the count across ranks under DDP/FSDP, then multiply by the world size)",
        ),
        _rule(
            "AG130", "lr-from-micro-counter", "F4", E, MED,
            "the learning rate written into the optimizer's param groups, or a LambdaLR "
            "function that ignores its step, is computed from a counter that advances on every "
            "micro-batch (or a schedule's counter of optimizer steps starts each pass at the "
            "micro-batches before it) while the schedule is counted in optimizer steps: the "
            "schedule runs K times fast",
            "feed the schedule a counter of optimizer steps — increment it after "
            "`optimizer.step()` (nanoGPT: `iter_num += 1` outside the micro-step loop), or call "
            "`get_lr(it // K)`",
        ),
        _rule(
            "AG131", "lightning-epoch-shorter-than-window", "F7", E, HI,
            "Lightning `limit_train_batches` leaves epochs (or their last window) shorter than "
            "`accumulate_grad_batches`: the short window is stepped at the epoch's end with each "
            "loss still divided by K",
            "make `limit_train_batches` a multiple of `accumulate_grad_batches` (at least K), or "
            "lower `accumulate_grad_batches` to fit the epoch",
        ),
        _rule(
            "AG132", "hf-trainer-moe-router-loss-times-k", "LOSS_SCALE", E, MED,
            "the Hugging Face Trainer trains an MoE model with output_router_logits=True and "
            "gradient accumulation: the model adds its router loss on every micro-batch, and the "
            "Trainer (normalising the LM loss by num_items_in_batch) does not divide by K, so the "
            "router term weighs K times its coefficient",
            "divide the router coefficient by K (`config.router_aux_loss_coef = coef / K`), or "
            "subclass the Trainer and add `outputs.aux_loss * coef / K` yourself with "
            "`output_router_logits` off for the model's own sum",
        ),
        _rule(
            "AG133", "loss-divided-by-k-twice", "LOSS_SCALE", E, MED,
            "a function of the file returns the loss divided by K and its caller divides that "
            "result by K again before backward(): each micro-batch's gradient is scaled 1/K², "
            "the window's gradient is G / K",
            "divide by K in one place: drop the caller's division, or return the undivided loss "
            "from the helper",
        ),
        _rule(
            "AG134", "deepspeed-loss-divided-by-ga-twice", "LOSS_SCALE", E, HI,
            "the loss given to engine.backward() is already divided by K while the DeepSpeed "
            "config has gradient_accumulation_steps > 1: the engine's backward divides by GA "
            "again, the gradient is G / K",
            "pass the undivided loss to engine.backward(loss): it divides by "
            "gradient_accumulation_steps itself (or pass scale_wrt_gas=False if you divide by hand)",
        ),
        _rule(
            "AG135", "clip-before-unscale", "F8", E, HI,
            "gradient clipping runs before GradScaler.unscale_: the backward ran on the scaled "
            "loss, so the clip compares S times the gradient with its threshold (S, the loss "
            "scale, is 65536 at the start) and the step applies the clipped gradient divided by S",
            "call `scaler.unscale_(optimizer)` right before the clip, at the boundary: "
            "`scaler.unscale_(optimizer); clip_grad_norm_(model.parameters(), max_norm); "
            "scaler.step(optimizer); scaler.update()`",
        ),
        _rule(
            "AG142", "hf-loss-term-not-divided-by-k", "LOSS_SCALE", E, MED,
            "a Hugging Face Trainer loss adds a mean of its own micro-batch (a z-loss, a "
            "regulariser) beside a term normalised by num_items_in_batch: the Trainer does not "
            "divide that loss by K, so the mean is summed over the window and weighs K times "
            "its coefficient",
            "divide that term by the accumulation steps (`coef * aux / "
            "self.current_gradient_accumulation_steps` in compute_loss, or the K of the "
            "TrainingArguments in a compute_loss_func), or normalise it by the window's count "
            "as the main term is",
        ),
        _rule(
            "AG136", "hf-compute-loss-num-items-divided-by-k", "LOSS_SCALE", E, MED,
            "a Hugging Face Trainer subclass's compute_loss divides by gradient_accumulation_steps "
            "a loss already normalised by num_items_in_batch (the whole window's token count): "
            "the window's gradient is G / K",
            "drop the division by gradient_accumulation_steps: a loss summed over the micro-batch "
            "and divided by num_items_in_batch is already the window's share",
        ),
        _rule(
            "AG143", "hf-compute-loss-num-items-not-times-w", "F10", W, MED,
            "a Hugging Face Trainer subclass's compute_loss divides by num_items_in_batch (the "
            "window's token count summed over every process) and never multiplies by the "
            "number of processes, which the Trainer's own compute_loss does: on W processes DDP "
            "then averages again and the gradient is G / W",
            "multiply the loss by `self.accelerator.num_processes` when "
            "`self.args.average_tokens_across_devices` is set (as Trainer.compute_loss does), "
            "or return `super().compute_loss(...)`",
        ),
        _rule(
            "AG144", "lightning-window-count-divided-by-k", "LOSS_SCALE", W, MED,
            "a LightningModule's training_step returns a summed loss divided by the whole "
            "window's count (a name such as win_tokens or num_items_in_batch), and Lightning "
            "divides the returned loss by accumulate_grad_batches again: the update is G / K",
            "multiply the returned loss by `self.trainer.accumulate_grad_batches`",
        ),
        _rule(
            "AG145", "horizon-from-micro-batch-tokens", "F4", W, MED,
            "an iteration horizon (warmup, decay, max_iters) is converted from a token or "
            "sample budget by one micro-batch's size, while the file's other conversion counts "
            "an iteration as the K micro-batches it accumulates: that horizon is K times long",
            "divide the budget by the tokens (samples) of one optimizer iteration, K micro-batches",
        ),
        _rule(
            "AG146", "factor-over-unnormalised-term", "LOSS_SCALE", W, MED,
            "a factor that undoes the engine's averages (the number of processes, K) multiplies "
            "a sum holding a term normalised by the window's count and a per-micro-batch term: "
            "the latter weighs that factor times its large-batch share",
            "multiply only the normalised term by the factor",
        ),
        _rule(
            "AG147", "micro-batch-statistics", "MICRO_STAT", W, MED,
            "values of the micro-batch (advantages, rewards) are centred or whitened by that "
            "micro-batch's own mean and spread inside a window of several micro-batches, "
            "where the large batch uses the window's statistics",
            "standardise the window's values once before the micro-batch loop and slice them",
        ),
        _rule(
            "AG148", "window-drawn-ahead-with-dataloader-sync", "F1", E, MED,
            "a window's batches are drawn from the prepared DataLoader before "
            "accelerator.accumulate() runs on them while the Accelerator keeps "
            "sync_with_dataloader: the last window steps on each of its micro-batches",
            "GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False), or draw each "
            "batch inside the window",
        ),
        _rule(
            "AG149", "grad-changed-in-substep-hook", "F3", E, HI,
            "a gradient is zeroed or masked (rows frozen by hand, a 0/1 mask, zero_grad) in Hugging "
            "Face's TrainerCallback.on_substep_end, which runs after every micro-batch of a window "
            "but the last: those entries step on the last micro-batch's gradient alone",
            "make the change in on_pre_optimizer_step, which runs once per optimizer step on the "
            "window's whole gradient (or freeze the parameters with requires_grad=False)",
        ),
        _rule(
            "AG150", "checkpoint-inside-window", "F13", W, MED,
            "a training checkpoint (weights, optimizer, counter; no gradient) is saved every N "
            "micro-batches with N not a multiple of K and resumed with its counter as saved: a "
            "run resumed from a checkpoint inside a window steps on the rest of that window only",
            "save only at a window's boundary (test the counter against K too), or on resume "
            "round the counter down to the window's start and replay the window",
        ),
        _rule(
            "AG151", "sync-counts-k-in-short-window", "F11", W, MED,
            "the gradient sync is decided by the micro-batch's position compared with K while "
            "the loop's windows can be shorter (a remainder window, a loss divided by the "
            "window's length): a short window's last micro-batch is never reduced",
            "decide the sync against the window's own length: `j < len(window) - 1`",
        ),
        _rule(
            "AG152", "ds-train-batch-without-world", "F1", W, MED,
            "a DeepSpeed config gives train_batch_size as micro-batch x K without the number "
            "of processes and no gradient_accumulation_steps: DeepSpeed derives the "
            "accumulation as K / W, so on W > 1 processes each rank steps W times as often",
            "give \"gradient_accumulation_steps\": K explicitly, or write train_batch_size as "
            "micro x K x world size",
        ),
        _rule(
            "AG153", "scheduler-stepped-by-deepspeed-and-script", "F4", E, HI,
            "a scheduler handed to deepspeed.initialize (the engine steps it at each "
            "accumulation boundary) is also stepped by the script: the schedule advances "
            "twice or more per optimizer step",
            "remove the script's scheduler.step(): the engine steps the scheduler it was given; "
            "or keep it out of deepspeed.initialize and step it once per optimizer step yourself",
        ),
        _rule(
            "AG154", "accumulated-grad-reduced-per-backward", "F10", E, HI,
            "a post-accumulate-grad hook all-reduces (SUM) the parameter's .grad, the window's "
            "running sum, after every backward: the i-th micro-batch of a window reaches the "
            "optimizer multiplied by W^(K-i)",
            "reduce the incoming gradient (Tensor.register_hook, whose argument is the "
            "micro-batch's own gradient), or reduce .grad once after the window's last backward",
        ),
        _rule(
            "AG155", "hf-trainer-model-mean-loss", "LOSS_SCALE", E, HI,
            "the stock Hugging Face Trainer with gradient accumulation trains a model class whose "
            "forward takes **kwargs but whose loss is a plain mean ignoring num_items_in_batch: "
            "the Trainer does not divide that loss by K, so the gradient is K times the large "
            "batch's (and a mean of per-micro-batch means when their label counts differ)",
            "give the Trainer `compute_loss_func=` a function that sums the loss over the "
            "micro-batch and divides by num_items_in_batch (e.g. `F.cross_entropy(logits.flatten(0, -2), "
            "labels.flatten(), ignore_index=-100, reduction='sum') / num_items_in_batch`); or set "
            "`model.accepts_loss_kwargs = False` before building the Trainer, so it divides by K "
            "(exact only for equal-size micro-batches of a per-sample loss)",
        ),
        _rule(
            "AG156", "fsdp2-divide-factor-one-unit", "F10", E, HI,
            "an FSDP2 gradient divide factor set on one unit (the root) while fully_shard made "
            "other units too: set_gradient_divide_factor does not recurse, so the other units "
            "still average over the ranks (W times apart from the root's own parameters, or "
            "every gradient averaged when the root holds none)",
            "set it on every unit: `for m in model.modules(): if isinstance(m, FSDPModule): "
            "m.set_gradient_divide_factor(...)`; or keep FSDP2's average and normalise the "
            "loss by the window's count times the world size",
        ),
        _rule(
            "AG157", "accelerate-short-last-window", "F7", W, MED,
            "Accelerate's accumulate() steps the short last window of a pass over the prepared "
            "loader (its batches per process are not a multiple of K) while accelerator.backward "
            "still divides that window's loss by K: its r micro-batches reach the optimizer as "
            "r/K of their mean gradient",
            "scale the short window's loss back, `accelerator.backward(loss * K / r)` with "
            "r = min(K, len(loader) - (i // K) * K); or size the data so that each process's "
            "pass is a multiple of K batches",
        ),
        _rule(
            "AG158", "ema-every-micro-step", "F4", W, MED,
            "a moving average of the weights (an EMA, a momentum teacher) is updated on every "
            "micro-step while the optimizer steps once per window: it moves K times per "
            "optimizer step (momentum m^K), and a teacher that feeds the loss changes inside "
            "the window",
            "update the average under the same boundary test as the optimizer step, once per "
            "window, after optimizer.step()",
        ),
        _rule(
            "AG159", "comm-hook-sums-without-average", "F10", E, HI,
            "a DDP communication hook of the script's own all-reduces the bucket with SUM and "
            "divides it nowhere: DDP writes the hook's result into .grad, so the optimizer "
            "receives the ranks' sum, W times the average DDP's own reduction gives",
            "divide the bucket by the process group's size in the hook "
            "(`bucket.buffer().div_(dist.get_world_size())` before the all_reduce, or the "
            "result in its `then` callback), use `ReduceOp.AVG`, or register torch's "
            "`default_hooks.allreduce_hook`",
        ),
        _rule(
            "AG160", "clip-given-gradients", "F8", E, HI,
            "a norm or value clip is handed the gradients (`[p.grad for p in ...]`, FSDP2's "
            "`p.grad.to_local()`) instead of the parameters: it reads each tensor's `.grad`, "
            "finds none, and clips nothing",
            "pass the parameters: `clip_grad_norm_(model.parameters(), max_norm)` (on FSDP2 "
            "the DTensor parameters give the global norm across shards)",
        ),
        _rule(
            "AG161", "accelerate-accumulate-unprepared-loader", "F7", W, MED,
            "`accelerator.accumulate()` over a DataLoader `accelerator.prepare` never wrapped: "
            "Accelerate cannot see where a pass ends, so a pass's last micro-batches are "
            "carried into the next pass's first window",
            "pass the DataLoader to `accelerator.prepare(...)` and iterate the one it returns",
        ),
        _rule(
            "AG162", "deepspeed-undivided-loss-without-gas-scaling", "LOSS_SCALE", E, HI,
            "`engine.backward(loss, scale_wrt_gas=False)` on a loss nothing divides (a "
            "micro-batch mean) while the config's gradient_accumulation_steps > 1: the engine "
            "sums GA full means, GA x the large batch's gradient",
            "call `engine.backward(loss)` (the engine divides by its GA), or divide the loss "
            "by K (or normalise by the window's count) before `scale_wrt_gas=False`",
        ),
        _rule(
            "AG163", "lightning-manual-global-step-several-optimizers", "F4", W, MED,
            "a learning rate computed from Lightning's global_step in manual optimisation with "
            "several optimizers: global_step advances on every optimizer's step, N per update, "
            "so the schedule runs N times ahead",
            "count updates yourself, or divide: `self.trainer.global_step // len(self.optimizers())` "
            "when every optimizer steps on every update",
        ),
        _rule(
            "AG164", "window-count-term-divided-by-k", "LOSS_SCALE", E, MED,
            "a loss divided by K is a sum of terms one of which is already divided by the "
            "window's count (over all its micro-batches): that term weighs 1/K of its coefficient",
            "divide by K only the terms that are one micro-batch's means: `dpo / K + alpha * "
            "nll_sum / window_tokens`",
        ),
        _rule(
            "AG165", "stepped-optimizer-never-cleared", "F7", E, MED,
            "an optimizer stepped at the window's boundary whose gradients nothing in the file "
            "clears, beside another that is cleared: every earlier window's gradient stays in "
            "its .grad and each step applies their sum",
            "call that optimizer's `zero_grad()` after its step",
        ),
        _rule(
            "AG166", "fsdp2-children-only", "F10", E, MED,
            "FSDP2 `fully_shard` applied to a model's submodules only, never to the model: the "
            "parameters outside those units are never reduced, each rank steps them on its own "
            "data",
            "shard the root after its children: `fully_shard(model)`",
        ),
        _rule(
            "AG167", "grad-overwritten-every-micro-step", "F3", E, MED,
            "`.grad` assigned (not added to) on every micro-step of a window from gradients "
            "`torch.autograd.grad` made, the optimizer stepping after the window: only the last "
            "micro-batch's gradient reaches it",
            "add to `.grad` (`p.grad = g if p.grad is None else p.grad + g`) or write the "
            "window's sum once before the step",
        ),
        _rule(
            "AG168", "wrapper-gated-twice", "F14", E, MED,
            "an optimizer wrapper that steps only on every N-th call of its own step() is also "
            "called only at the loop's boundary: the optimizer steps once every N windows",
            "gate once: call the wrapper's step() and zero_grad() after every backward and let it "
            "count, or build it with its accumulation set to 1 and keep the loop's boundary test",
        ),
        _rule(
            "AG169", "horizon-whole-dataset", "F4", E, MED,
            "a schedule horizon counts the optimizer steps of the whole dataset, which a "
            "DistributedSampler splits over the ranks: each rank makes W times fewer steps",
            "divide by the world size too (`len(ds) // (micro_bs * K * world_size)`), or count "
            "the rank's own loader: `len(loader) // K * epochs`",
        ),
        _rule(
            "AG170", "spawn-world-size-env", "F10", E, MED,
            "the world size is read from the WORLD_SIZE variable with a default of 1 in ranks "
            "that mp.spawn started, which sets none: a division by it averages nothing",
            "read it from the process group, `dist.get_world_size()` after "
            "`init_process_group`, or pass it to the spawned function as an argument",
        ),
        _rule(
            "AG171", "accelerate-block-runs-a-window", "F14", E, MED,
            "one accelerator.accumulate() block runs a whole window of backwards while the "
            "Accelerator accumulates too: it steps once every K blocks, K windows",
            "build the Accelerator with gradient_accumulation_steps=1 (the loop accumulates "
            "already), or enter accumulate() once per micro-batch and let Accelerate gate the step",
        ),
        _rule(
            "AG173", "lightning-loss-divided-by-k", "LOSS_SCALE", E, HI,
            "a LightningModule's training_step returns its loss divided by K, and Lightning's "
            "automatic optimisation divides it by accumulate_grad_batches again: G / K",
            "return the loss undivided: Lightning scales it by 1/accumulate_grad_batches itself",
        ),
        _rule(
            "AG174", "hf-scaled-flag-on-micro-mean", "LOSS_SCALE", E, HI,
            "a Trainer subclass sets loss_is_scaled_for_ga = True, so the Trainer never divides "
            "by K, while its compute_loss returns a per-micro-batch mean: K x the large batch",
            "return the window's share (the summed loss divided by num_items_in_batch), or set "
            "loss_is_scaled_for_ga = False so the Trainer divides the mean by K",
        ),
        _rule(
            "AG175", "rank-local-progress-whole-dataset", "F4", E, MED,
            "a schedule written by hand counts the data this rank consumed against a horizon "
            "counting the whole dataset a DistributedSampler splits: it moves W x slow",
            "count over the ranks (all-reduce each step's count before adding it), or divide "
            "the horizon by the world size",
        ),
        _rule(
            "AG176", "plain-backward-inside-accumulate", "LOSS_SCALE", E, HI,
            "loss.backward() inside accelerator.accumulate() while the Accelerator accumulates "
            "K > 1: only accelerator.backward divides by K, so the update is K x the large batch",
            "call accelerator.backward(loss) instead of loss.backward()",
        ),
        _rule(
            "AG177", "hf-clip-setting-not-passed", "F9", W, MED,
            "the script's own clip setting never reaches TrainingArguments, which clips every "
            "step at its default max_grad_norm = 1.0",
            "pass it: TrainingArguments(..., max_grad_norm=cfg.grad_clip) (0 turns clipping off)",
        ),
        _rule(
            "AG178", "step-test-wider-than-sync", "F7", E, MED,
            "the optimizer steps on `flag or tail` while the gradient sync is decided by `flag` "
            "alone: the tail's window is stepped on a gradient never reduced",
            "synchronise on the same test the step uses (include the tail case in the flag)",
        ),
        _rule(
            "AG179", "hand-reduce-one-param-group", "F10", E, HI,
            "a hand-written all-reduce iterates over one parameter group while the optimizer "
            "has several: the other groups' gradients are never averaged over the ranks",
            "reduce every group (`for g in opt.param_groups: for p in g[\"params\"]: ...`), or "
            "iterate over model.parameters()",
        ),
        _rule(
            "AG180", "module-outside-the-wrapper", "F10", E, MED,
            "a module holding an nn.Parameter (a loss's learnable temperature or weights) is "
            "stepped by the optimizer but lives outside the DDP/FSDP wrapper, and nothing "
            "all-reduces its gradient: each rank steps it on its own gradient",
            "make it a submodule of the wrapped model, or all-reduce its parameters' gradients "
            "(sum, then divide by the world size) before the optimizer step",
        ),
        _rule(
            "AG181", "fsdp-sync-back-on-root-only", "F11", E, HI,
            "FSDP2's gradient sync is turned off for every unit but back on with "
            "recurse=False, for the root unit only: the other units never reduce-scatter",
            "turn it on as it was turned off: model.set_requires_gradient_sync(True) "
            "(recurse=True, the default), or set_requires_gradient_sync(is_last_micro_step)",
        ),
        _rule(
            "AG182", "deepspeed-zero-clip-dropped", "F9", E, HI,
            "a DeepSpeed config's gradient_clipping of 0 (no clipping meant) is dropped by a "
            "filter that keeps truthy values only: DeepSpeed clips at its default 1.0",
            "filter on `v is not None`, not on truthiness, or set gradient_clipping after the filter",
        ),
        _rule(
            "AG183", "generator-spent-before-write-back", "F10", E, HI,
            "the parameters of a hand-written gradient reduction are a generator that the "
            "gathering loop consumes: the loop writing the reduced values back runs zero times",
            "hold them in a list (`[p for p in model.parameters() if p.grad is not None]`)",
        ),
        _rule(
            "AG184", "comm-hook-averages-twice", "F10", E, HI,
            "a DDP communication hook divides the bucket by the world size and then all-reduces "
            "with ReduceOp.AVG: the gradient is divided by W twice",
            "keep one of the two: all_reduce with SUM after the division, or AVG without it",
        ),
        _rule(
            "AG185", "hand-reduce-list-before-unfreeze", "F10", E, HI,
            "a hand-written gradient reduction iterates a list of the parameters that required "
            "a gradient when it was built, and the training loop later unfreezes others: their "
            "gradients are never averaged over the ranks",
            "iterate model.parameters() at every reduction (skipping p.grad is None), or rebuild "
            "the list when parameters are unfrozen",
        ),
        _rule(
            "AG186", "lightning-optimizer-step-gated", "F14", E, HI,
            "a LightningModule's optimizer_step override steps the optimizer only on some of "
            "its calls while the Trainer accumulates: Lightning already calls it once per "
            "accumulate_grad_batches batches, so the step is gated twice and the windows in "
            "between are cleared at the next window's first batch without a step",
            "call optimizer.step(closure=optimizer_closure) on every call of optimizer_step, "
            "and let accumulate_grad_batches set the window",
        ),
        _rule(
            "AG187", "accumulation-option-dropped", "F1", E, HI,
            "a command-line accumulation option is filtered out before it reaches the config "
            "dataclass (its key is not one of the fields): the dataclass's accumulation field "
            "keeps its default, 1, and the optimizer steps on every micro-batch",
            "name the option after the field (or map it: `grad_accum=args."
            "gradient_accumulation_steps`), and fail loudly on options no field takes",
        ),
        _rule(
            "AG188", "deepspeed-engine-step-never-called", "F10", E, HI,
            "a DeepSpeed engine runs the backwards but its engine.step() is never called, the "
            "client optimizer stepped directly: the engine never reaches an accumulation "
            "boundary and never reduces the gradients over the ranks",
            "call engine.step() after every engine.backward(loss) and let the engine step the "
            "optimizer at its boundary; never step or clear the optimizer yourself",
        ),
        _rule(
            "AG189", "forward-on-unwrapped-module", "F10", E, HI,
            "the training forward runs on the module a data-parallel wrapper was made from "
            "(fabric.setup, accelerator.prepare, DDP), not on the wrapper: DDP never reduces "
            "the gradients, each rank steps on its own",
            "run the forward through the wrapper the call returned (`model(x)`, or hand "
            "`model` to the loss helper), or rebind the same name (`net = DDP(net)`)",
        ),
        _rule(
            "AG190", "batch-samples-count-not-gathered", "F6", W, MED,
            "a Trainer subclass's get_batch_samples returns this rank's own token count, never "
            "gathered over the processes, while the Trainer multiplies the loss by their number",
            "gather the count as the Trainer does: `num_items_in_batch = self.accelerator."
            "gather(num_items_in_batch).sum()` before returning it",
        ),
        _rule(
            "AG191", "hf-accumulation-key-dropped", "F1", E, HI,
            "a settings dict handed to HfArgumentParser.parse_dict(..., allow_extra_keys=True) "
            "spells the accumulation key otherwise than gradient_accumulation_steps: the key is "
            "dropped and the Trainer does not accumulate",
            "spell it `gradient_accumulation_steps` (allow_extra_keys hides every misspelling: "
            "keep it off, or check the keys it ignored)",
        ),
        _rule(
            "AG192", "zero-grad-in-per-batch-lightning-hook", "F3", E, HI,
            "zero_grad in a Lightning hook that runs on every batch (on_train_batch_start/end, "
            "on_before/after_backward) while the Trainer accumulates: the window's gradient is "
            "cleared inside the window",
            "let Lightning clear the gradient (it does, once per window); clear only when "
            "`batch_idx % trainer.accumulate_grad_batches == 0`, if at all",
        ),
        _rule(
            "AG193", "reduced-copy-not-written-back", "F10", E, HI,
            "a hand-written all-reduce reduces a new tensor made from each gradient "
            "(p.grad / W, p.grad.clone()) and never writes it back into .grad: the gradients "
            "are not averaged",
            "reduce .grad itself (divide in place, then all_reduce(p.grad)), or copy the "
            "reduced tensor back into p.grad",
        ),
        _rule(
            "AG194", "window-hook-gated-again", "F14", E, MED,
            "a method called once per window (after the loop's inner loop ran the window's "
            "micro-batches) steps only every K windows by a counter of its own: the step is "
            "gated twice",
            "step on every call of the window hook, or drop the loop's own grouping",
        ),
        _rule(
            "AG195", "loop-variable-rebound", "F10", E, HI,
            "a loop writing reduced gradients back assigns them to its own loop variable "
            "(`g = synced`): the name is rebound, the gradient tensor is untouched",
            "copy into the tensor: `g.copy_(synced)`",
        ),
        _rule(
            "AG196", "module-replaced-after-wrapping", "F10", E, MED,
            "a submodule is set on the model (or on the wrapper's inner module) after DDP (or "
            "accelerator.prepare) wrapped it: DDP never reduces the new module's gradients",
            "replace the module before wrapping the model, then build the optimizer",
        ),
        _rule(
            "AG197", "low-precision-hand-buffer", "F12", W, MED,
            "each micro-step's gradient is added into accumulation buffers the script made in "
            "bf16/fp16: the window's sum is rounded to that dtype at every micro-step, a drift "
            "growing like sqrt(K) (an error from K >= 4), while the large batch sums once in fp32",
            "make the accumulation buffers float32 (`torch.zeros_like(p, dtype=torch.float32)`) "
            "and cast once, after the window's sum, if a low-precision copy is needed",
        ),
        _rule(
            "AG198", "optimizer-step-horizon-times-k", "F4", W, MED,
            "a schedule's horizon multiplies the num_training_steps the HF Trainer passes to "
            "create_scheduler (already optimizer steps) by K: the schedule is K times longer "
            "than the run",
            "use that count as it is: it already counts optimizer steps (after accumulation)",
        ),
        _rule(
            "AG199", "count-reduced-through-a-copy", "F6", E, HI,
            "dist.all_reduce is given a new tensor made on the spot (an integer count converted "
            "with .float(), a clone, arithmetic): it sums into that copy, which nothing keeps, "
            "so the script's count stays this rank's own",
            "convert first, then reduce the tensor you keep: `n = n.float(); dist.all_reduce(n)`",
        ),
        _rule(
            "AG300", "forward-through-inner-module", "F10", E, MED,
            "the training forward calls the module inside a DDP wrapper directly "
            "(`model.module(x)`, `model.module.get_action_and_value(...)`, or a name bound to "
            "`model.module`): DDP reduces only the backwards of its own forward",
            "call the wrapper (`model(x)`); to run another method through DDP, make it the "
            "module's forward or dispatch it from forward (e.g. `forward(self, *a, mode=...)`)",
        ),
        _rule(
            "AG301", "unfrozen-after-ddp-was-built", "F10", E, MED,
            "a parameter frozen before DDP(net) is unfrozen after it and no DDP is built again: "
            "DDP's reducer holds the parameters that required a gradient when it was built",
            "unfreeze before wrapping, or build the DDP wrapper again after unfreezing "
            "(and hand the optimizer the parameter)",
        ),
        _rule(
            "AG302", "stepping-batches-under-k-schedule", "F4", E, MED,
            "a schedule horizon read from trainer.estimated_stepping_batches while a "
            "GradientAccumulationScheduler sets K per epoch: it is read before the callback "
            "sets K and counts every batch as a step",
            "sum ceil(batches per epoch / that epoch's K) over the epochs "
            "(callback.get_accumulate_grad_batches(epoch)) and size the schedule with it",
        ),
        _rule(
            "AG303", "coalesced-block-per-micro-step", "F2", E, MED,
            "engine.coalesce_grad_reduction() entered around one backward inside the "
            "micro-step loop: each block's flush overwrites the previous one",
            "enter one coalesce_grad_reduction() block around all of the window's backwards, "
            "then call engine.step()",
        ),
        _rule(
            "AG304", "training-step-drops-item-count", "F5", E, MED,
            "a Trainer.training_step override calls super().training_step(model, inputs) "
            "without num_items_in_batch: each micro-batch is averaged over its own tokens",
            "pass it on: super().training_step(model, inputs, num_items_in_batch)",
        ),
        _rule(
            "AG305", "unmanaged-accumulation-steps-every-micro-batch", "F1", E, MED,
            "managed_gradient_accumulation false while the loop calls engine.step() after every "
            "backward: every step() is a boundary, no accumulation",
            "remove managed_gradient_accumulation: false (DeepSpeed then gates step() itself), "
            "or call engine.step() only at the window's last micro-batch",
        ),
        _rule(
            "AG306", "compute-loss-forwards-self-model", "F10", W, MED,
            "a Trainer.compute_loss override runs the forward through self.model instead of "
            "the model argument (the DDP wrapper or DeepSpeed engine on several processes)",
            "call the model the Trainer passes: outputs = model(**inputs)",
        ),
        _rule(
            "AG307", "chunked-window-divided-by-k", "F7", W, MED,
            "windows cut by a chunking helper (chunked(loader, K)) with every loss divided by "
            "K: a pass's last, shorter chunk is divided as a full one",
            "divide by the window's own length (len(window)) or its sample/token count",
        ),
        _rule(
            "AG308", "tokens-per-iter-without-world", "F4", E, MED,
            "an iteration count derived from tokens per iteration that multiplies the per-rank "
            "accumulation steps without the world size (nanoGPT's tokens_per_iter)",
            "tokens_per_iter = gradient_accumulation_steps * world_size * batch_size * "
            "block_size",
        ),
        _rule(
            "AG309", "schedule-from-unsplit-loader", "F4", E, MED,
            "a Lightning schedule sized from len(...train_dataloader()) on several devices: the "
            "fresh loader is not yet split over the ranks",
            "size it from self.trainer.estimated_stepping_batches (or num_training_batches, "
            "per rank)",
        ),
        _rule(
            "AG310", "engine-zero-grad-every-micro-batch", "F3", E, MED,
            "engine.zero_grad() beside engine.backward()/engine.step() on every micro-batch "
            "under ZeRO-0/1 with gradient_accumulation_steps > 1",
            "remove it: DeepSpeed clears the gradients itself after the step at its boundary",
        ),
        _rule(
            "AG311", "clip-before-boundary-backward", "F8", E, MED,
            "a clip gated to the accumulation boundary runs before that micro-step's backward, "
            "the step after it: it clips the first K-1 micro-batches' gradient only",
            "clip after the window's last backward, right before the step (DeepSpeed: set "
            "gradient_clipping in the config, or clip after engine.backward at the boundary)",
        ),
        _rule(
            "AG312", "clip-per-functional-micro-step", "F8", E, MED,
            "a functional loop clips each micro-step's torch.autograd.grad gradients before "
            "adding them to the accumulators: every micro-batch is clipped on its own",
            "add the raw gradients to the accumulators and clip once after the window (after "
            "they are averaged over the ranks), right before the step",
        ),
        _rule(
            "AG313", "trainer-steps-in-micro-batches", "F4", E, MED,
            "a TrainingArguments warmup_steps/max_steps computed as the dataset over the "
            "per-device batch, with no accumulation steps or world size: it counts one "
            "device's micro-batches, the Trainer counts optimizer steps",
            "divide by gradient_accumulation_steps x world size (or give warmup_ratio, which "
            "the Trainer applies to its own count of optimizer steps)",
        ),
        _rule(
            "AG314", "set-training-resets-accumulation", "F1", E, HI,
            "TrainingArguments.set_training(...) without gradient_accumulation_steps on "
            "arguments built with K > 1: it sets the parameter to its default 1",
            "pass gradient_accumulation_steps=K to set_training as well (or set it after)",
        ),
        _rule(
            "AG315", "deepspeed-boundary-read-after-step", "F4", E, HI,
            "engine.is_gradient_accumulation_boundary() read after engine.step() in the same "
            "iteration gates a scheduler step: the flag then answers for the next micro-batch, "
            "so the schedule steps one micro-batch before each optimizer step",
            "read the flag before engine.step() (at_boundary = "
            "engine.is_gradient_accumulation_boundary(); engine.step(); if at_boundary: ...), or "
            "hand the scheduler to deepspeed.initialize(lr_scheduler=...)",
        ),
        _rule(
            "AG316", "backward-before-loop-never-cleared", "F7", W, MED,
            "a backward run before the training loop (a compile warm-up, a gradient check) "
            "whose gradient nothing clears before a loop that clears only after its optimizer "
            "steps: it is added to the first window",
            "clear the gradient after that pass (model.zero_grad(set_to_none=True) or "
            "optimizer.zero_grad()), or run it under torch.no_grad() when it needs no gradient",
        ),
        _rule(
            "AG317", "fractional-epoch-mixed-units", "F4", E, HI,
            "a scheduler stepped with a fractional epoch (sched.step(epoch + i / n)) whose "
            "numerator counts micro-batches and whose denominator counts optimizer steps "
            "(n = len(loader) // K): the schedule runs K x fast",
            "count the same thing above and below: (i + 1) / len(loader) (micro-batches), or "
            "((i + 1) // K) / steps_per_epoch (optimizer steps)",
        ),
        _rule(
            "AG318", "resume-skips-saved-iteration", "F13", E, HI,
            "a resume restoring the saved iteration counter + 1 while the checkpoint saved the "
            "iteration still to run (saved before its optimizer step, or after the counter "
            "moved): one whole window is skipped",
            "restore the counter as saved (iter_num = ckpt[\"iter_num\"]), or save it after "
            "the optimizer step and before the counter moves if the + 1 is to stay",
        ),
        _rule(
            "AG319", "clip-before-window-in-hf-callback", "F8", E, HI,
            "gradient clipping in a Hugging Face TrainerCallback's on_step_begin: it runs "
            "before the window's first backward, on cleared gradients, so the window's "
            "gradient is never clipped",
            "clip in on_pre_optimizer_step (after the window's last backward, before the "
            "step), or set TrainingArguments(max_grad_norm=...)",
        ),
        _rule(
            "AG320", "gradients-of-last-pass-reduced", "F10", E, HI,
            "a list of gradients assigned anew on every pass of a loop (per parameter group) "
            "and all-reduced after it: only the last pass's gradients are averaged",
            "build one list over every pass (grads += [...] or grads.extend(...)) before the "
            "reduction, or reduce inside the loop",
        ),
        _rule(
            "AG321", "loss-times-world-over-mean-count", "F10", E, HI,
            "a loss multiplied by the world size and divided by a count the ranks averaged "
            "(Fabric's all_reduce defaults to a mean; accelerator.reduce(n, 'mean'); "
            "ReduceOp.AVG): N / W in the denominator, every token weighs W x",
            "reduce the count with a sum (fabric.all_reduce(n, reduce_op='sum'), "
            "accelerator.reduce(n, 'sum'), dist.all_reduce(n)), or drop the * world_size",
        ),
        _rule(
            "AG322", "accumulate-with-accelerator-k-one", "F1", E, HI,
            "accelerator.accumulate() around the steps while the Accelerator was built without "
            "gradient_accumulation_steps (1) and the file declares K > 1: the optimizer steps "
            "on every micro-batch",
            "Accelerator(gradient_accumulation_steps=K) with the K the file declares",
        ),
        _rule(
            "AG323", "fsdp-divide-factor-without-world", "F10", E, HI,
            "FSDP2's set_gradient_divide_factor given K without the world size: it replaces "
            "the division by W, so the ranks' gradients are summed, not averaged",
            "set_gradient_divide_factor(K * world_size) for a loss not divided by K (or "
            "world_size for one divided by K)",
        ),
        _rule(
            "AG324", "helper-clips-every-call-steps-on-flag", "F8", E, HI,
            "a step helper (timm's loss-scaler style) whose optimizer step runs under its "
            "boundary flag while its clip runs on every call: the partial sum is clipped "
            "after every micro-batch",
            "clip (and unscale_) under the same flag as the step: if need_update: "
            "unscale_; clip; step; update",
        ),
        _rule(
            "AG325", "module-held-on-the-trainer", "F10", E, HI,
            "a module held as an attribute of a Hugging Face Trainer subclass, outside its "
            "model, whose parameters the Trainer's optimizer steps: the Trainer wraps only "
            "self.model, so their gradient is never averaged over the processes",
            "make it part of the model (model.add_module('score_head', head) before building "
            "the Trainer), or all-reduce its gradients before the optimizer step",
        ),
        _rule(
            "AG327", "resume-repeats-saved-micro-batch", "F13", E, HI,
            "a resume starting a loop at the saved index of the micro-batch the loop had "
            "already trained (saved after its backward): it is trained again and every later "
            "window shifts by one",
            "save i + 1 (the next micro-batch to run), or start at state[key] + 1",
        ),
        _rule(
            "AG326", "clip-key-dropped-by-parse-dict", "F9", W, MED,
            "a clip setting spelled as no TrainingArguments field (DeepSpeed's "
            "gradient_clipping) in a dict parsed with allow_extra_keys=True: dropped, so the "
            "Trainer clips at its default max_grad_norm = 1.0",
            "spell it max_grad_norm (0.0 turns the Trainer's clipping off)",
        ),
        _rule(
            "AG328", "clip-none-dropped-by-filter", "F9", E, MED,
            "a setting max_grad_norm = None or 0.0 (clipping off) filtered out with the other "
            "None (or false) values before TrainingArguments(**kwargs): the Trainer clips at "
            "its default 1.0",
            "pass max_grad_norm=0.0 to turn the Trainer's clipping off (0 is kept by the filter), "
            "or set kwargs['max_grad_norm'] = 0.0 when the setting is None",
        ),
        _rule(
            "AG329", "deepspeed-checkpoint-on-late-boundary-flag", "F13", E, MED,
            "a checkpoint gated on engine.is_gradient_accumulation_boundary() read after "
            "engine.step(): taken on the micro-batch before each boundary, inside a window",
            "read the flag before engine.step() (boundary = engine.is_gradient_accumulation_"
            "boundary(); engine.backward(loss); engine.step(); if boundary: save), or gate on "
            "engine.global_steps changing",
        ),
        _rule(
            "AG330", "loss-coefficient-updated-every-micro-step", "F4", E, MED,
            "a loss coefficient's controller (an adaptive KL coefficient) updated on every "
            "micro-step: the coefficient changes inside the window and moves K times per "
            "optimizer step",
            "update the controller once per optimizer step, after the window, from the "
            "window's statistic (the mean over its micro-batches, and over the ranks)",
        ),
        _rule(
            "AG331", "resume-skips-optimizer-steps-as-batches", "F13", E, MED,
            "a resume giving skip_first_batches a count of optimizer steps (divided by K) "
            "where the loader yields micro-batches: micro-batches trained again, windows "
            "misaligned",
            "skip the optimizer steps done in the epoch times gradient_accumulation_steps "
            "micro-batches",
        ),
        _rule(
            "AG332", "micro-counter-restored-from-step-count", "F13", E, MED,
            "the micro-step counter deciding the window's boundary restored from a count of "
            "optimizer steps (scheduler last_epoch, global_step) without multiplying by K",
            "restore it as the optimizer steps done times K (or save and restore the micro-step "
            "counter itself)",
        ),
        _rule(
            "AG333", "hand-schedule-horizon-in-micro-batches", "F4", E, MED,
            "a hand-written schedule (get_lr(iter_num)) given a counter of optimizer steps "
            "but a horizon counting the loader's micro-batches (epochs * len(loader))",
            "size the horizon in optimizer steps: epochs * (len(loader) // K)",
        ),
        _rule(
            "AG334", "hf-training-step-divides-by-configured-k", "F7", W, MED,
            "a Trainer training_step override dividing the loss by "
            "args.gradient_accumulation_steps: an epoch's short last window is scaled as if full",
            "divide by self.current_gradient_accumulation_steps, as the Trainer's own "
            "training_step does",
        ),
        _rule(
            "AG335", "accumulation-divided-by-world-to-one", "F1", E, MED,
            "the accumulation steps (a per-rank count of 2 or 3) divided by the world size "
            "(nanoGPT's `//= ddp_world_size`): K is 1 on two ranks, the loop steps on every "
            "micro-batch",
            "set the count for the whole job (K x world size) before the division, or drop the "
            "division when the count is per rank",
        ),
        _rule(
            "AG336", "hf-compute-loss-func-ignores-count", "LOSS_SCALE", E, MED,
            "an HF Trainer compute_loss_func that never reads num_items_in_batch: the Trainer "
            "skips its / K and multiplies by the processes, so a per-micro-batch mean weighs "
            "K x W times the large batch's",
            "sum the per-token losses and divide by num_items_in_batch in the function "
            "(loss.sum() / num_items_in_batch when it is given)",
        ),
        _rule(
            "AG337", "fsdp-ignored-params-never-reduced", "F10", E, MED,
            "a parameter in fully_shard's ignored_params that no hand all-reduce averages: "
            "each rank steps its own copy on its own gradient",
            "all-reduce its gradient by hand before the step (dist.all_reduce(p.grad); "
            "p.grad /= world_size), or keep it inside an FSDP2 unit",
        ),
        _rule(
            "AG338", "hf-compute-loss-func-times-world", "F10", E, MED,
            "an HF Trainer compute_loss_func multiplying its loss by the world size, which the "
            "Trainer does itself: the update is W times the large batch's",
            "drop the multiplication: the Trainer multiplies a compute_loss_func's loss by the "
            "processes (average_tokens_across_devices)",
        ),
        _rule(
            "AG339", "optimizer-step-horizon-divided-by-k", "F4", E, HI,
            "a schedule horizon that divides a count of optimizer steps (Lightning's "
            "estimated_stepping_batches, the Trainer's num_training_steps) by K: the schedule "
            "ends K times early",
            "use the count as it is: it already counts optimizer steps "
            "(`total = self.trainer.estimated_stepping_batches`)",
        ),
        _rule(
            "AG340", "second-accelerator-resets-k", "F1", E, HI,
            "an Accelerator built without gradient_accumulation_steps after the training's: "
            "Accelerate's shared GradientState takes its K of 1, and the optimizer steps after "
            "every micro-batch",
            "hand the training's Accelerator to the helper instead of building another (or "
            "build the other one first, or with the same gradient_accumulation_steps)",
        ),
        _rule(
            "AG341", "module-fabric-never-set-up", "F10", E, MED,
            "a module an optimizer steps that a data-parallel Fabric never set up: its "
            "gradients are never averaged over the ranks",
            "give it to fabric.setup / fabric.setup_module too (or set up the module that "
            "holds it), so Fabric averages its gradients",
        ),
        _rule(
            "AG342", "tail-stepped-after-unsynced-loop", "F11", E, MED,
            "an optimizer step after the loop for the epoch's leftover micro-batches, whose "
            "backwards ran under no_sync (the loop syncs at multiples of K only)",
            "synchronise the epoch's last micro-batch too and step it inside the loop",
        ),
        _rule(
            "AG343", "hf-scaled-flag-false-on-window-share", "LOSS_SCALE", E, MED,
            "an HF Trainer subclass with loss_is_scaled_for_ga = False whose compute_loss is "
            "already normalised by num_items_in_batch: divided by K twice",
            "drop `loss_is_scaled_for_ga = False` and divide only the per-micro-batch terms by "
            "self.current_gradient_accumulation_steps (or return the summed loss over "
            "num_items_in_batch for every term)",
        ),
        _rule(
            "AG344", "modules-in-a-plain-container", "F10", E, HI,
            "modules an optimizer steps held in a plain dict or list under a data-parallel "
            "wrapper: never registered, so their gradients are never averaged over the ranks",
            "hold them in an nn.ModuleDict or nn.ModuleList",
        ),
        _rule(
            "AG345", "fsdp2-divide-factor-k-and-loss-over-k", "LOSS_SCALE", E, MED,
            "FSDP2's gradient divide factor set to K x W while the loss is divided by K too: "
            "divided by K twice",
            "keep one division by K: the world size as the divide factor (FSDP2's default) "
            "with the loss divided by K, or K x W with the loss undivided",
        ),
        _rule(
            "AG346", "unfrozen-after-prepare", "F10", W, MED,
            "a parameter unfrozen after accelerator.prepare wrapped the model in DDP: never "
            "averaged over the ranks",
            "unfreeze before accelerator.prepare (let the optimizer skip it until then: a zero "
            "learning rate for its group), or all-reduce its gradient by hand before each step",
        ),
        _rule(
            "AG347", "accumulation-field-dropped-by-signature-filter", "F1", E, HI,
            "a config dataclass filtered to a constructor's signature (Lightning's Trainer, "
            "TrainingArguments, Accelerator) whose accumulation field is named otherwise: "
            "dropped, K stays 1",
            "name the field after the constructor's keyword (accumulate_grad_batches, "
            "gradient_accumulation_steps) or pass it explicitly",
        ),
        _rule(
            "AG348", "fsdp2-tail-discarded-after-unsynced-loop", "F7", E, MED,
            "the epoch's leftover micro-batches, run under set_requires_gradient_sync(False), "
            "thrown away (or stepped) after the loop: FSDP2 holds their gradient unsharded, "
            "outside the .grad zero_grad clears, and reduces it with the next window",
            "skip the leftover before its forward (stop the loop at the last full window), "
            "or synchronise its last backward and step it",
        ),
        _rule(
            "AG349", "deepspeed-engine-steps-inside-hand-window", "F1", E, HI,
            "engine.step() after every backward in a loop that accumulates by hand under "
            "engine.no_sync(), with the DeepSpeed config's gradient_accumulation_steps at 1: "
            "the engine steps after every micro-batch",
            "call engine.step() only at the window's last micro-batch, or let DeepSpeed "
            "accumulate (gradient_accumulation_steps = K, engine.step() after every backward)",
        ),
        _rule(
            "AG350", "compute-loss-drops-item-count", "LOSS_SCALE", E, MED,
            "a Trainer subclass's compute_loss calls super().compute_loss without "
            "num_items_in_batch: each micro-batch's mean, and the Trainer skips its / K",
            "pass the count on: super().compute_loss(model, inputs, return_outputs, "
            "num_items_in_batch=num_items_in_batch) (or **kwargs)",
        ),
        _rule(
            "AG351", "divides-by-trainer-accelerator-k", "LOSS_SCALE", E, HI,
            "a Trainer subclass divides by self.accelerator.gradient_accumulation_steps, which "
            "the Trainer's own Accelerator holds as 1: the term is not divided by K",
            "divide by self.current_gradient_accumulation_steps (the window's K; "
            "self.args.gradient_accumulation_steps for a full window)",
        ),
        _rule(
            "AG352", "count-reduced-as-a-python-number", "F6", E, HI,
            "a count handed to Lightning's strategy.reduce as a Python number: returned "
            "unchanged, it stays this rank's own",
            "reduce a tensor (torch.tensor(n, device=...)) and use what the call returns",
        ),
        _rule(
            "AG353", "rank-loader-horizon-divided-by-world", "F4", E, MED,
            "a schedule horizon counted from a DistributedSampler loader's length (one rank's "
            "share) and divided by the world size too: W x early",
            "drop the world size: epochs * len(loader) // K optimizer steps per rank",
        ),
        _rule(
            "AG354", "grad-scaled-in-post-accumulate-hook", "LOSS_SCALE", E, HI,
            "a register_post_accumulate_grad_hook hook that scales .grad: it scales the "
            "window's running sum after every backward, the first micro-batch K times",
            "divide the loss by K, or scale each backward's own gradient with a tensor "
            "register_hook",
        ),
        _rule(
            "AG355", "one-based-index-with-plus-one", "F13", E, HI,
            "micro-batches numbered from 1 while the boundary test adds 1 more: every pass's "
            "first window holds K - 1 micro-batches",
            "count from 0 with (i + 1) % K == 0, or test i % K == 0 with start=1",
        ),
        _rule(
            "AG356", "made-in-configure-optimizers", "F10", E, HI,
            "a parameter or submodule created in a LightningModule's configure_optimizers under "
            "a data-parallel Trainer: DDP wrapped the module before, never averages it",
            "create it in __init__ (or setup), before the strategy wraps the module",
        ),
        _rule(
            "AG357", "grad-tensor-outside-the-reduction", "F10", E, HI,
            "a tensor requiring a gradient that is not a parameter (a buffer, a plain tensor "
            "attribute of a module) in a data-parallel run, stepped by an optimizer: the "
            "wrappers reduce parameters' gradients only",
            "make it an nn.Parameter (FSDP2: a one-element tensor, torch.zeros(1), not a 0-d "
            "one), or all-reduce its gradient (op=AVG) before the step",
        ),
        _rule(
            "AG359", "trained-parameters-ignored-by-ddp", "F10", E, HI,
            "DDP told to ignore names taken from named_parameters() (not only buffers, not "
            "filtered to frozen ones): the ignored trainable parameters are never all-reduced",
            "give _set_params_and_buffers_to_ignore_for_model only buffers (named_buffers()) "
            "or frozen parameters",
        ),
        _rule(
            "AG360", "split-batches-horizon-times-processes", "F4", E, HI,
            "a scheduler prepared by an Accelerator with DataLoaderConfiguration(split_batches="
            "True) sized times num_processes: under split_batches it steps once per optimizer "
            "step, so the schedule is W x long",
            "drop the * num_processes from the horizon (and the warm-up) when split_batches is "
            "on; keep it only where the prepared scheduler steps num_processes times",
        ),
        _rule(
            "AG361", "raw-optimizer-cleared-inside-accumulate", "F3", E, HI,
            "zero_grad() inside accelerator.accumulate() on the optimizer given to prepare, "
            "not the one prepare returned: it clears the gradients on every micro-batch",
            "call zero_grad() on the prepared optimizer (the name prepare returned)",
        ),
        _rule(
            "AG362", "term-over-window-count-beside-super-loss", "F10", E, HI,
            "a compute_loss override adds a term divided by num_items_in_batch (all processes' "
            "count) to super().compute_loss(...), which the parent multiplies by num_processes "
            "and the term not: after DDP's average it weighs 1/W",
            "multiply that term by self.accelerator.num_processes, as the parent does its own "
            "loss (or add it inside the model's loss)",
        ),
        _rule(
            "AG363", "submodule-wrapped-in-place", "F10", E, HI,
            "only a submodule is wrapped for data parallelism, in place (net.backbone = "
            "DDP(net.backbone)), while the optimizer steps the whole module: the other "
            "parameters are never averaged",
            "wrap the whole module (model = DDP(net)) and call it through the wrapper",
        ),
        _rule(
            "AG364", "peft-adapters-kept-low-precision", "F12", E, HI,
            "PEFT told not to upcast the adapters (autocast_adapter_dtype=False) of a bf16/fp16 "
            "base: the trainable adapters and their .grad stay low precision, and each window's "
            "K micro-batches are summed in that dtype, a drift growing with K",
            "leave autocast_adapter_dtype at its default True (fp32 adapters on a bf16 base), "
            "or cast the adapters to fp32 after get_peft_model",
        ),
        _rule(
            "AG365", "lightning-backward-hook-term-not-divided-by-k", "LOSS_SCALE", E, HI,
            "a LightningModule's backward(loss) override adds a term to the loss it is given, "
            "which Lightning has already divided by accumulate_grad_batches: the term is not, "
            "and weighs K times its large-batch share",
            "divide the term by self.trainer.accumulate_grad_batches, or add it in training_step",
        ),
        _rule(
            "AG366", "parameters-assigned-after-wrap", "F10", E, HI,
            "load_state_dict(..., assign=True) after DDP wrapped the model: the "
            "loaded tensors replace the parameters the wrapper registered, so nothing averages "
            "the gradients of the ones the forward uses",
            "drop assign=True, or load before wrapping (and build the optimizer after)",
        ),
        _rule(
            "AG367", "accelerator-step-read-as-optimizer-step", "F4", E, HI,
            "a learning rate computed from accelerator.step, Accelerate's micro-batch counter "
            "(it moves on every accumulate() and restarts with each prepared loader), as if it "
            "counted optimizer steps: the schedule moves K times per update and restarts every "
            "epoch",
            "count the optimizer steps yourself (`completed_steps += 1` when "
            "accelerator.sync_gradients) and compute the rate from that, or use a scheduler "
            "prepared by the Accelerator",
        ),
        _rule(
            "AG368", "trainer-override-counts-its-own-windows", "F13", W, MED,
            "a Trainer override finds the window with a micro-batch counter of its own, which "
            "runs on across epochs while the Trainer starts its windows again every epoch: "
            "after the first short window the test fires off the boundaries",
            "act when self.state.global_step differs from the step you last acted on",
        ),
        _rule(
            "AG369", "lightning-gradient-term-after-each-backward", "LOSS_SCALE", E, HI,
            "a LightningModule's on_after_backward adds a term to .grad while the Trainer "
            "accumulates: it runs after every micro-batch, so the term counts K times per "
            "update",
            "add it in on_before_optimizer_step, or divide it by "
            "self.trainer.accumulate_grad_batches",
        ),
        _rule(
            "AG370", "clip-switched-off-by-leaving-it-out", "F9", E, HI,
            "clipping switched off by leaving max_grad_norm out of the Trainer's arguments: "
            "it keeps its default 1.0, and the Trainer clips every update whose norm exceeds 1",
            "pass max_grad_norm=0.0 when clipping is off",
        ),
        _rule(
            "AG371", "backward-left-in-a-trainer-callback", "F7", E, HI,
            "a TrainerCallback hook runs a backward of its own and clears nothing after it: "
            "the Trainer clears only after each optimizer step, so that gradient joins a "
            "window's sum",
            "clear it after reading (model.zero_grad(set_to_none=True)), or use "
            "torch.autograd.grad",
        ),
        _rule(
            "AG372", "hf-trainer-low-precision-model", "F12", E, HI,
            "the Hugging Face Trainer trains a model built in bf16/fp16: its .grad sums each "
            "window's micro-batches in that dtype (bf16=True is autocast, no fp32 gradients)",
            "build the model in float32 and let bf16=True (autocast) compute in bf16",
        ),
        _rule(
            "AG375", "boundary-method-never-called", "F1", E, HI,
            "a boundary test names a method without calling it (if self.at_boundary:): the "
            "bound method is always true, so the optimizer steps on every micro-batch",
            "call it: if self.at_boundary():",
        ),
        _rule(
            "AG376", "window-helper-gated-again", "F14", E, MED,
            "a helper that runs a whole window of K backwards is called by a loop that still "
            "steps only every K calls: each step sums K windows, K times fewer steps",
            "step after every call of the helper, or pass it one micro-batch per call",
        ),
        _rule(
            "AG377", "wrapper-dropped", "F10", E, HI,
            "the data-parallel wrapper is made and then dropped (the call's result never bound, "
            "or its name rebound to something built from the inner module): the training "
            "forward runs on a bare module, DDP never averages the gradients",
            "bind the wrapper and train through it (`model = accelerator.prepare_model(model)`); "
            "compile before wrapping (`model = DDP(torch.compile(model))`) or compile the wrapper",
        ),
        _rule(
            "AG378", "token-lm-refuses-item-count", "F5", W, MED,
            "a token-level LM class sets accepts_loss_kwargs = False under the stock Trainer "
            "with K > 1: each micro-batch's token mean divided by K, a mean of means",
            "drop the attribute (the class's loss honours num_items_in_batch), or, when the "
            "forward cannot take it, override compute_loss to sum the tokens and divide by "
            "num_items_in_batch",
        ),
        _rule(
            "AG379", "item-count-skips-other-tokens", "LOSS_SCALE", E, MED,
            "a Trainer loss divided by num_items_in_batch ignores another label value than "
            "-100 (ignore_index=PAD_ID): the Trainer counts those positions, the loss skips them",
            "label the positions to skip with -100 (`labels[mask == 0] = -100`) and use "
            "ignore_index=-100, the value the Trainer's count leaves out",
        ),
        _rule(
            "AG381", "grads-divided-by-world-under-ddp", "F10", E, MED,
            "the gradients are divided by the world size by hand while DDP/FSDP already "
            "averaged them (DDP does not sum): the optimizer receives G / W",
            "drop the division: DDP's all-reduce averages the gradients over the ranks",
        ),
        # ---- config rules (accumguard check-config) ----
        _rule(
            "AG200", "config-invalid-value", "", E, HI,
            "a batch-size or accumulation value has the wrong type or is not positive",
            "use a positive integer (or \"auto\" when the Hugging Face Trainer fills the config)",
        ),
        _rule(
            "AG201", "batch-arithmetic", "", E, HI,
            "train_batch_size must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps "
            "x world size",
            "fix one of the three values, or give only two of them and let DeepSpeed derive the third",
        ),
        _rule(
            "AG202", "config-ga-mismatch", "F2", E, HI,
            "the training loop accumulates K micro-batches but the config's gradient_accumulation_steps "
            "differs",
            "set gradient_accumulation_steps to the loop's K (or use engine.coalesce_grad_reduction() "
            "with gradient_accumulation_steps 1)",
        ),
        _rule(
            "AG203", "default-clipping", "F9", W, HI,
            "gradient_clipping is not set: DeepSpeed (>= 0.19) clips the gradient norm at 1.0 by default",
            "set \"gradient_clipping\" explicitly: 0.0 to disable, or the max-norm you mean",
        ),
        _rule(
            "AG204", "low-precision-accumulation", "F12", W, MED,
            "bf16/fp16 training with gradient accumulation and no fp32 gradient accumulation: "
            "rounding error grows with K",
            "add \"data_types\": {\"grad_accum_dtype\": \"fp32\"}",
        ),
        _rule(
            "AG205", "zero-reductions-per-micro-step", "", N, HI,
            "ZeRO stage 2/3 with gradient accumulation reduces gradients on every micro-step "
            "(K reductions per optimizer step)",
            "decide consciously: keep it, overlap it (zero_optimization.overlap_comm), or reduce once "
            "per step with `engine.coalesce_grad_reduction()` / accumguard's deferred mode "
            "(cost table in docs/performance.md)",
        ),
        _rule(
            "AG206", "misspelled-key", "", W, MED,
            "unknown config key relevant to accumulation (probably misspelled): DeepSpeed ignores or "
            "rejects it and uses the default",
            "rename it to the suggested key",
        ),
        _rule(
            "AG207", "auto-values", "", N, HI,
            "\"auto\" values are filled by the Hugging Face Trainer from its TrainingArguments; "
            "the batch arithmetic can only be checked once they are concrete",
            "pass --accumulation-steps/--world-size to check what the loop will use, or write numbers",
        ),
    )
}

del E, W, N, HI, MED, LO


def rule_matches(code: str, patterns: list[str]) -> bool:
    """True when ``code`` equals or starts with one of ``patterns`` (``AG1`` selects AG101..AG199)."""
    return any(code.startswith(p.strip().upper()) for p in patterns if p.strip())


def filter_findings(
    findings: list[Finding], *, select: list[str] | None, ignore: list[str] | None
) -> list[Finding]:
    """Apply ``--select``/``--ignore`` (prefix match, ignore wins)."""
    out = []
    for f in findings:
        if select and not rule_matches(f.code or "", select):
            continue
        if ignore and rule_matches(f.code or "", ignore):
            continue
        out.append(f)
    return out
