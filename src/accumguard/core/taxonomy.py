"""The failure taxonomy: every known way gradient accumulation goes silently wrong.

This is the one place where a failure class is named, explained and given its
fix. The diagnosis, the runtime guard, the lint rules, ``watch`` and the demo
all refer to classes by id and read the words from here, so a class is added
(or a fix reworded) in exactly one place. Pure Python: the static checks import
it without torch.

Notation: ``g_i`` is micro-batch i's gradient of its *summed* loss, ``n_i`` its
sample/token count, ``N`` the sum of the counts over the window's micro-steps and
ranks. The intended gradient is ``G = sum(g_i) / N``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FRAMEWORKS", "FailureClass", "TAXONOMY", "describe", "fix_for", "fix_in", "title"]


@dataclass(frozen=True)
class FailureClass:
    """One bug class: what goes wrong, what the optimizer receives instead, the fix."""

    id: str
    title: str
    mechanism: str
    fix: str


def _fc(id_: str, title_: str, mechanism: str, fix: str) -> FailureClass:
    return FailureClass(id_, title_, mechanism, fix)


_CLASSES = (
    _fc("OK", "correct large-batch update", "the optimizer receives G",
        "Nothing to fix: the update matches the large batch."),
    _fc("F1", "optimizer step (and zero_grad) every micro-step",
        "K small steps on single micro-batch means; K times the step count",
        "Call optimizer.step(), scheduler.step() and zero_grad() only at the window boundary "
        "(every K micro-steps), letting gradients accumulate in between; or drive the loop "
        "with accumguard.Accumulator."),
    _fc("F1b", "optimizer step every micro-step, zero_grad only at the boundary",
        "each micro-step applies the running partial sum g_1 + ... + g_i",
        "Move optimizer.step() under the same boundary condition as zero_grad(): step once "
        "per window, after its last backward."),
    _fc("F2", "engine boundary reset: only the last micro-batch reaches the optimizer",
        "the engine treats every backward as a boundary (DeepSpeed ZeRO-1/2 with config GA=1 "
        "and a manual loop); the optimizer gets the last g_i only",
        "Let the engine see the boundary: DeepSpeed config gradient_accumulation_steps=K with "
        "engine.backward/engine.step every micro-step, or GA=1 with the K backwards inside "
        "engine.coalesce_grad_reduction() and one engine.step() after them."),
    _fc("F3", "zero_grad inside the window: only the last micro-batch reaches the optimizer",
        "gradients are cleared between the backwards of one window; the last g_i survives",
        "Call zero_grad() once per window, after the optimizer step, never between the "
        "backwards of one window."),
    _fc("F2/F3", "last micro-batch only (engine boundary reset F2, or zero_grad inside the "
        "window F3)", "only the last micro-step's gradient reaches the optimizer",
        "Call zero_grad() only after the optimizer step (F3); with DeepSpeed, make the "
        "engine's gradient_accumulation_steps agree with your loop or use "
        "engine.coalesce_grad_reduction() (F2)."),
    _fc("F4", "LR schedule out of step with the optimizer steps",
        "correct gradient, but the learning rate is at the wrong point of its schedule: the "
        "scheduler steps per micro-step (K or W times ahead), or its horizon is counted in "
        "another unit than its steps (it ends early, or never reaches its end)",
        "Step the LR scheduler once per optimizer step, at the boundary, on the optimizer's "
        "step count (not per micro-step, not once per process for a shared schedule), and "
        "count its horizon in the steps it takes."),
    _fc("F5", "mean of per-micro-batch means / K (uneven token counts)",
        "sum(g_i / n_i) / K instead of sum(g_i) / N",
        "Sum per-token losses and divide by the window's total count N (all micro-steps, all "
        "ranks; all-reduce the count once per window) instead of averaging each micro-batch "
        "and dividing by K."),
    _fc("F6", "mean over ranks of rank-local means (uneven counts across ranks)",
        "the average over ranks of each rank's own normalised gradient",
        "Divide by the global count: all-reduce the window's token count and scale the summed "
        "loss by W/N_global, since DDP then averages over the W ranks."),
    _fc("F7", "final partial window scaled by 1/K, dropped, or leaked into the next window",
        "the leftover gradient is too small, missing, or added to the next step",
        "Normalise the final partial window by its own count (not by K) and step on it, or "
        "drop it explicitly on every rank; clear gradients at every epoch end."),
    _fc("F8", "gradient clipped per micro-step (or before unscale)",
        "each g_i is shrunk separately before the sum",
        "Clip once per optimizer step, after the gradients are synchronised (and unscaled), on "
        "the global norm."),
    _fc("F9", "engine default clipping the user did not ask for",
        "G uniformly shrunk to norm 1 (DeepSpeed gradient_clipping defaults to 1.0)",
        "Set DeepSpeed's gradient_clipping explicitly (0.0 disables it) to the clipping you "
        "intend; its default clips at 1.0."),
    _fc("F10", "averaging over ranks missing or doubled",
        "W*G (all_reduce SUM without /W) or G/W (a mean averaged again)",
        "Average over ranks exactly once: after a manual all_reduce(SUM) divide by W, and do "
        "not divide again when DDP/FSDP already averages."),
    _fc("F11", "gradient sync flag wrong for the micro-step",
        "the sync decision does not cover the window: set after the forward, inverted "
        "(the last micro-batch arrives one step late) or never re-enabled (no reduction)",
        "Enter no_sync() (or set require_backward_grad_sync / set_requires_gradient_sync) "
        "before the forward, False on the first K-1 micro-steps and True on the last."),
    _fc("F12", "low-precision gradient accumulation",
        "bf16/fp16 gradients summed in low precision: rounding drift growing with K",
        "Accumulate gradients in fp32 (fp32 gradient buffers or master weights, FSDP2 "
        "reduce_dtype=float32, DeepSpeed data_types.grad_accum_dtype='fp32'), not in "
        "bf16/fp16."),
    _fc("F13", "accumulation counter off by one after a resume or across epochs",
        "the boundary drifts (windows of K-1 / K+1 micro-steps), or a resume restarts one "
        "window early or late (a window trained twice or skipped)",
        "Derive the boundary from (micro_step + 1) % K with a counter reset at every "
        "boundary, and save/restore it with the checkpoint."),
    _fc("F14", "double gating: the engine accumulates K and the caller loops K around step()",
        "the optimizer steps every K-th window, on the last micro-batch only, scaled 1/K^2",
        "Gate the boundary in one place only: either call engine.backward()/engine.step() on "
        "every micro-batch and let DeepSpeed's gradient_accumulation_steps=K decide, or set "
        "it to 1 and accumulate in your loop inside engine.coalesce_grad_reduction()."),
    _fc("LOSS_SCALE", "loss weights off: the units do not each weigh 1 / the window's count",
        "tokens carry weights other than 1/N (a constant factor, or a pattern that is neither "
        "a per-micro-batch nor a per-rank mean)",
        "Sum per-token losses over the micro-batch and divide by the window's global token "
        "count N once (all micro-steps, all ranks), accounting for what the engine divides by "
        "(DDP averages over ranks, Accelerate's backward divides by its "
        "gradient_accumulation_steps, Lightning divides by accumulate_grad_batches)."),
    _fc("MICRO_STAT", "a statistic taken per micro-batch where the large batch takes the window's",
        "values inside the loss (advantages, rewards, scores) are centred or whitened by each "
        "micro-batch's own mean and spread; the large batch uses the window's, so each "
        "micro-batch's terms are shifted and scaled differently",
        "Compute the statistic once over the window (all K micro-batches, and every rank when "
        "the large batch spans them) before the micro-batch loop, and slice the normalised "
        "values for each micro-batch. When the algorithm normalises per group on purpose "
        "(GRPO: one prompt's completions), keep each group inside one micro-batch."),
    _fc("EXTRA_SYNC", "gradients synchronised on non-final micro-steps: extra all-reduces "
        "per optimizer step",
        "micro-steps before the window's last all-reduce their gradient too; the optimizer "
        "receives the same gradient, at the cost of up to K-1 extra reduction rounds per step",
        "Skip the reduction on micro-steps 1..K-1: run their forward and backward inside "
        "model.no_sync() (DDP), or call set_requires_gradient_sync(False) before them and "
        "True before the last (FSDP2)."),
    _fc("EXTRA_STEP", "an optimizer stepped again with no backward pass and no new gradient since its "
        "previous step",
        "a second update for one window's gradient: momentum, Adam's moments or weight decay "
        "(or a gradient left in place, applied again) move the parameters; more optimizer "
        "steps than windows",
        "Step once per window, after its last backward. With Accelerate or the HF Trainer on "
        "DeepSpeed, accelerator.backward already calls engine.step() at the boundary: do not "
        "call engine.step() yourself; after set_gradient_accumulation_boundary(True), set it "
        "back to False before the next window's first backward."),
    _fc("NO_UPDATE", "no update: the parameters did not move",
        "no gradient reached the optimizer (sync never re-enabled, gradients cleared before "
        "step, or the step was skipped)",
        "Check that the last micro-step of each window synchronises gradients and that "
        "optimizer.step() runs before zero_grad()."),
)

TAXONOMY: dict[str, FailureClass] = {c.id: c for c in _CLASSES}


def title(class_id: str) -> str:
    """The one-line name of ``class_id`` (the id itself when unknown)."""
    c = TAXONOMY.get(class_id)
    return c.title if c else class_id


def fix_for(class_id: str) -> str:
    """The canonical fix for ``class_id`` (empty when unknown)."""
    c = TAXONOMY.get(class_id)
    return c.fix if c else ""


#: The training frameworks whose own idiom names a fix, outermost first: the HF Trainer and
#: Lightning run on Accelerate/DDP, and their users write neither, so their idiom wins.
FRAMEWORKS = ("lightning", "transformers", "accelerate")

_LIGHTNING_SYNC = (
    "Lightning: DDP decides whether a backward all-reduces at its forward, which Lightning "
    "runs around training_step, so a block_backward_sync() entered inside training_step "
    "defers nothing. In manual optimisation set "
    "`self.trainer.strategy.model.require_backward_grad_sync = (batch_idx + 1) % K == 0` in "
    "on_train_batch_start; automatic optimisation with Trainer(accumulate_grad_batches=K) "
    "does this itself.")
_ACCELERATE_SYNC = (
    "Accelerate: run the forward and accelerator.backward of micro-steps 1..K-1 inside "
    "`with accelerator.accumulate(model):` (Accelerator(gradient_accumulation_steps=K)) or "
    "`with accelerator.no_sync(model):`; both skip the gradient all-reduce until the "
    "window's last micro-step.")

#: The fix of a class in a framework's own words, where the class's generic fix (plain
#: optimizer calls, model.no_sync()) is not what its users write.
_FRAMEWORK_FIXES: dict[tuple[str, str], str] = {
    ("F1", "lightning"): (
        "Lightning: in automatic optimisation set Trainer(accumulate_grad_batches=K) and let "
        "Lightning step; in manual optimisation call opt.step() and opt.zero_grad() only on "
        "the window's last batch ((batch_idx + 1) % K == 0)."),
    ("F1", "transformers"): (
        "Hugging Face Trainer: set gradient_accumulation_steps=K in the TrainingArguments and "
        "let the Trainer step; an overridden training_step or a callback must not call "
        "optimizer.step(), zero_grad() or the scheduler's step()."),
    ("F1", "accelerate"): (
        "Accelerate: create Accelerator(gradient_accumulation_steps=K) and run each "
        "micro-step inside `with accelerator.accumulate(model):`, calling step() and "
        "zero_grad() of the optimizer (and step() of the scheduler) that accelerator.prepare "
        "returned: they act only on the window's last micro-step. If you do, and the steps "
        "every micro-step come at the end of the prepared DataLoader: with "
        "sync_with_dataloader (on by default) every micro-step after the loader's last "
        "batch was drawn is a sync step, so a window whose batches are fetched ahead steps "
        "on each of them; fetch them inside the window, or pass "
        "GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False)."),
    ("F3", "lightning"): (
        "Lightning: in manual optimisation call opt.zero_grad() only right after opt.step() "
        "on the window's last batch ((batch_idx + 1) % K == 0), never on the other batches; "
        "automatic optimisation with accumulate_grad_batches=K zeroes them itself."),
    ("F3", "transformers"): (
        "Hugging Face Trainer: do not zero gradients in an overridden training_step or "
        "compute_loss: the Trainer zeroes them after each optimizer step."),
    ("F3", "accelerate"): (
        "Accelerate: call zero_grad() on the optimizer that accelerator.prepare returned, "
        "inside `with accelerator.accumulate(model):` (it then acts only on the window's "
        "last micro-step); model.zero_grad() or the unprepared optimizer's zero_grad() clear "
        "the window on every micro-step."),
    ("F4", "lightning"): (
        "Lightning: step the scheduler once per optimizer step: in automatic optimisation "
        "return it from configure_optimizers with \"interval\": \"step\" (Lightning steps it "
        "after each optimizer step); in manual optimisation call sch.step() inside the same "
        "`if (batch_idx + 1) % K == 0:` as opt.step()."),
    ("F4", "transformers"): (
        "Hugging Face Trainer: let the Trainer step the scheduler (lr_scheduler_type in the "
        "TrainingArguments, or one passed as optimizers=(optimizer, scheduler)): it steps it "
        "once per optimizer step; do not step it in a callback or in training_step."),
    ("F4", "accelerate"): (
        "Accelerate: pass the scheduler through accelerator.prepare and call its step() "
        "inside `with accelerator.accumulate(model):`: the prepared scheduler steps only on "
        "the window's last micro-step (num_processes times per call unless "
        "split_batches=True, which its horizon must allow for)."),
    ("F8", "lightning"): (
        "Lightning: in automatic optimisation set Trainer(gradient_clip_val=..., "
        "gradient_clip_algorithm=\"norm\"), which clips once per optimizer step after "
        "unscaling; in manual optimisation call self.clip_gradients(opt, "
        "gradient_clip_val=..., gradient_clip_algorithm=\"norm\") once, right before "
        "opt.step() on the window's last batch."),
    ("F8", "transformers"): (
        "Hugging Face Trainer: set max_grad_norm in the TrainingArguments (the Trainer clips "
        "once per optimizer step, after unscaling) and do not clip in training_step."),
    ("F8", "accelerate"): (
        "Accelerate: call accelerator.clip_grad_norm_(model.parameters(), max_norm), which "
        "unscales first, only when accelerator.sync_gradients is True (the window's last "
        "micro-step), before the optimizer step."),
    ("F5", "lightning"): (
        "Lightning: count the window's valid tokens (or class weights) before its first "
        "batch and return from training_step the summed loss divided by that count times "
        "accumulate_grad_batches (Lightning divides the returned loss by it; times the "
        "world size too over the count of all processes under DDP)."),
    ("F5", "transformers"): (
        "Hugging Face Trainer: return from compute_loss the summed per-token loss divided "
        "by num_items_in_batch (the window's count), not each micro-batch's mean."),
    ("F5", "accelerate"): (
        "Accelerate: divide each micro-batch's summed loss by the window's count (over all "
        "processes, times accelerator.num_processes) and multiply by the accumulation steps, "
        "which accelerator.backward divides by."),
    ("F6", "transformers"): (
        "Hugging Face Trainer: keep TrainingArguments(average_tokens_across_devices=True) (the "
        "default): num_items_in_batch is then the window's count over all processes and the "
        "loss is scaled by their number; a compute_loss of your own divides the summed loss "
        "by num_items_in_batch."),
    ("F6", "accelerate"): (
        "Accelerate: count the window's tokens over all processes (accelerator.reduce(n, "
        "'sum') or accelerator.gather(n).sum()), divide the summed loss by that count and "
        "multiply it by accelerator.num_processes, since the prepared model averages."),
    ("F6", "lightning"): (
        "Lightning: divide the summed loss by the window's count over all processes "
        "(self.all_gather(n).sum(), or all_reduce) and multiply by trainer.world_size, since "
        "the DDP strategy averages the gradients (in automatic optimisation also by "
        "accumulate_grad_batches, which Lightning divides the returned loss by)."),
    ("F10", "lightning"): (
        "Lightning's DDP strategy already averages gradients over processes: the loss needs "
        "no division by the world size and no all-reduce of its own."),
    ("F10", "transformers"): (
        "The Hugging Face Trainer already handles the average over processes: return from "
        "compute_loss the loss of this batch (summed and divided by num_items_in_batch, or the "
        "model's own), with no division by the number of processes and no all-reduce."),
    ("F10", "accelerate"): (
        "Accelerate's prepared model already averages gradients over processes: pass "
        "accelerator.backward the loss of this process's micro-batch, with no division by "
        "num_processes and no all-reduce of its own."),
    ("LOSS_SCALE", "transformers"): (
        "The Hugging Face Trainer divides the loss compute_loss returns by "
        "gradient_accumulation_steps unless it counts it as already normalised to the window "
        "(the model's forward takes **kwargs, or a compute_loss_func is given, and "
        "num_items_in_batch is set; newer versions read the attribute loss_is_scaled_for_ga): "
        "in a compute_loss of your own, return the loss summed over the batch's tokens divided "
        "by num_items_in_batch, so each token weighs 1/N whichever way the Trainer counts it; "
        "never divide by gradient_accumulation_steps yourself as well."),
    ("LOSS_SCALE", "lightning"): (
        "Under automatic optimization Lightning divides the loss training_step returns by "
        "accumulate_grad_batches: return this micro-batch's mean, not divided by K; to weigh "
        "tokens by the window's count instead, return their sum / the window's count x "
        "accumulate_grad_batches. Under manual optimization nothing divides for you: divide "
        "by K (or by the window's count) before self.manual_backward."),
    ("LOSS_SCALE", "accelerate"): (
        "accelerator.backward divides the loss by the Accelerator's gradient_accumulation_steps "
        "(except under DeepSpeed, whose engine divides): pass it this micro-batch's mean, not divided by K "
        "yourself; to weigh tokens by the window's count instead, pass their sum / the "
        "window's count x gradient_accumulation_steps (x num_processes for a count "
        "all-reduced over processes)."),
    ("F11", "lightning"): _LIGHTNING_SYNC,
    ("F11", "accelerate"): _ACCELERATE_SYNC,
    ("EXTRA_SYNC", "lightning"): _LIGHTNING_SYNC,
    ("EXTRA_SYNC", "accelerate"): _ACCELERATE_SYNC,
}


def fix_in(class_id: str, frameworks: Iterable[str]) -> str | None:
    """The fix of ``class_id`` in the idiom of the outermost of ``frameworks`` that drove the
    run (:data:`FRAMEWORKS`), or None when it has none."""
    used = set(frameworks)
    for fw in FRAMEWORKS:
        if fw in used and (class_id, fw) in _FRAMEWORK_FIXES:
            return _FRAMEWORK_FIXES[(class_id, fw)]
    return None


def describe(class_id: str) -> str:
    """``"F3 — zero_grad inside the window: ..."``: the id with its title, for messages."""
    return f"{class_id} — {title(class_id)}"
