"""A large-batch reference loop in the same file as the accumulating one (how people check
their own loops): each iteration gathers a whole window's micro-batches into one batch, one
backward, one step. The accumulation count names the batch's size there, not a window of
micro-steps: no F1/F3 error (blind round 25 found both on two correct scripts)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source


def _errors(src: str) -> list[str]:
    return [f.code for f in lint_source(textwrap.dedent(src)) if f.severity.value == "error"]


_ACCUMULATING = """
import torch
import torch.nn.functional as F

def train(model, optimizer, args):
    for it in range(args.max_iters):
        for micro_step in range(args.gradient_accumulation_steps):
            x, y = get_batch(it, micro_step)
            loss = F.cross_entropy(model(x), y) / args.gradient_accumulation_steps
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
"""


def test_a_reference_loop_that_concatenates_the_window_is_not_f1() -> None:
    src = _ACCUMULATING + """
def reference(model, optimizer, args):
    for it in range(args.max_iters):
        xs, ys = zip(*[get_batch(it, m) for m in range(args.gradient_accumulation_steps)])
        x, y = torch.cat(xs), torch.cat(ys)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
"""
    assert _errors(src) == []
    # the same loop dividing its one loss by K meant to accumulate: still F1
    meant = src.replace("F.cross_entropy(model(x), y).backward()",
                        "(F.cross_entropy(model(x), y) / args.gradient_accumulation_steps).backward()")
    assert "AG101" in _errors(meant)


def test_a_reference_loop_over_whole_windows_with_several_optimizers_is_not_f1_or_f3() -> None:
    src = _ACCUMULATING + """
def reference(model, opts, batches, cfg):
    for w0 in range(0, len(batches) - len(batches) % cfg.grad_accum, cfg.grad_accum):
        ids = [i for b in batches[w0:w0 + cfg.grad_accum] for i in b]
        loss = F.cross_entropy(model(data[ids]), labels[ids], reduction="sum") / len(ids)
        loss.backward()
        for o in opts:
            o.step()
        for o in opts:
            o.zero_grad(set_to_none=True)
"""
    assert _errors(src) == []


def test_optimizers_stepped_in_a_loop_over_them_every_micro_batch_are_f1() -> None:
    src = """
import torch.nn.functional as F
grad_accum = 4
for i, (x, y) in enumerate(loader):
    (F.cross_entropy(model(x), y) / grad_accum).backward()
    for o in opts:
        o.step()
        o.zero_grad()
"""
    assert "AG101" in _errors(src)


_HARVEST = """
import torch
grad_accum = 4
for step in range(steps):
    acc = [torch.zeros_like(p) for p in master.parameters()]
    for k in range(grad_accum):
        work.zero_grad()
        (loss_fn(work, next(it)) / grad_accum).backward()
        for a, p in zip(acc, work.parameters()):
{read}
    for pm, a in zip(master.parameters(), acc):
        pm.grad = a
    opt.step()
    opt.zero_grad()
"""


def test_zero_grad_before_each_backward_whose_grad_is_summed_into_a_buffer_is_not_f3() -> None:
    """Each micro-step's .grad added to an fp32 buffer right after its backward (a bf16
    model accumulated by hand): clearing .grad every micro-step is the method. Reading
    .grad only to log it is no such buffer: F3 stays."""
    assert _errors(_HARVEST.format(read="            a += p.grad.float()")) == []
    assert _errors(_HARVEST.format(read="            a.add_(p.grad)")) == []
    assert "AG102" in _errors(_HARVEST.format(read="            print(p.grad.norm())"))


def test_a_reference_loop_over_the_number_of_windows_is_not_f1() -> None:
    """``for w in range(n_batches // accum)`` with the window's batches sliced out: each
    iteration is one whole window (blind round 25, writer a)."""
    src = _ACCUMULATING + """
def reference(model, opt, per_rank, cfg):
    for w in range(len(per_rank) // cfg.accum):
        ids = [i for b in per_rank[w * cfg.accum:(w + 1) * cfg.accum] for i in b]
        (F.cross_entropy(model(x[ids]), y[ids], reduction="sum") / len(ids)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""
    assert _errors(src) == []
    micro = src.replace("range(len(per_rank) // cfg.accum)", "range(cfg.accum)")
    assert "AG101" in _errors(micro)  # K iterations stepping every one of them: F1


def test_a_stepped_tail_behind_a_flag_with_the_loss_divided_by_k_is_ag141() -> None:
    """``update_now = (step + 1) % K == 0 or step + 1 == len(loader)`` then ``if update_now:``:
    the last window of a pass is stepped, and its loss was divided by K (blind round 25,
    writer a; the same test written inline in the ``if`` was found before)."""
    src = """
import torch
K = 4
for epoch in range(2):
    for step, (x, y) in enumerate(loader):
        update_now = (step + 1) % K == 0 or step + 1 == len(loader)
        loss = model(x).mean() / K
        loss.backward()
        if update_now:
            opt.step()
            opt.zero_grad()
"""
    found = [f for f in lint_source(textwrap.dedent(src)) if f.code == "AG141"]
    assert len(found) == 1 and "step + 1 == len(loader)" in found[0].message, found


def test_average_tokens_across_devices_false_in_a_spread_dict_is_ag140() -> None:
    """``TrainingArguments(**TRAIN_KW)`` with ``TRAIN_KW = dict(...,
    average_tokens_across_devices=False)`` (blind round 25, writer b)."""
    src = """
from transformers import TrainingArguments
TRAIN_KW = dict(output_dir="out", gradient_accumulation_steps=2,
                average_tokens_across_devices={value})
args = TrainingArguments(**TRAIN_KW)
"""
    codes = [f.code for f in lint_source(textwrap.dedent(src.format(value="False")))]
    assert codes == ["AG140"]
    assert [f.code for f in lint_source(textwrap.dedent(src.format(value="True")))] == []


def test_a_reference_loop_is_not_a_window_for_clipping_and_zero_grad_either() -> None:
    """The reference gathers each window by a comprehension over ``range(K)``, clips and
    clears an optimizer that a helper returned (its kind not in sight): one step, one clip,
    one zero_grad per whole window, so neither F8 nor F3 (blind round 30, writer c; only F1
    knew the shape before)."""
    src = _ACCUMULATING + """
def reference(args, world):
    ref, ropt, rsch = build(args)
    for step in range(args.total_steps):
        parts = [group(step, r, m) for r in range(world) for m in range(args.accum)]
        obs, acts = (torch.cat([p[i] for p in parts]) for i in range(2))
        (objective(ref, obs, acts) / obs.shape[0]).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ropt.step()
        rsch.step()
        ropt.zero_grad()
"""
    assert _errors(src) == []
    micro = src.replace("for step in range(args.total_steps):", "for step in range(args.accum):")
    assert {"AG102", "AG105"} <= set(_errors(micro)), _errors(micro)


def test_a_reference_that_steps_its_scheduler_once_per_rank_it_stands_for_is_not_ag114() -> None:
    """A one-process reference of an Accelerate run (whose prepared scheduler steps
    num_processes times per call) steps its own scheduler W times per whole window, the
    windows counted as ``len(x) // K`` or through a name made so (blind round 30, writer a,
    two correct scripts). In the training loop the same inner loop stays AG114."""
    src = """
import torch

def reference(per_rank, world, total, hp):
    K = hp["grad_accum"]
    n_win = len(per_rank[0]) // K
    sch = get_cosine_schedule_with_warmup(opt, hp["warmup"], total)
    for w in range(n_win):
        x = torch.cat([mb for r in per_rank for mb in r[w * K:(w + 1) * K]])
        model(x).loss.backward()
        opt.step()
        for _ in range(world):
            sch.step()
        opt.zero_grad()
"""
    assert _errors(src) == []
    assert _errors(src.replace("range(n_win)", "range(len(per_rank[0]) // K)")) == []
    training = src.replace("x = torch.cat([mb for r in per_rank for mb in r[w * K:(w + 1) * K]])",
                           "x = next(it)")
    assert _errors(training) == ["AG114"]


def test_a_reference_striding_by_k_and_a_nanogpt_skip_to_the_step() -> None:
    """Blind round 32, writer b: the reference walks the micro-batches with
    ``range(0, n_micro, K)`` (one iteration per window: no F1), and the training loop
    steps after ``if not last_in_window: continue``, the flag also true at the pass's end,
    every loss divided by K: AG141 (the short tail divided by K)."""
    src = """
import torch.nn.functional as F
gradient_accumulation_steps = 4

def reference(m, opt, per_rank, world):
    n_micro = len(per_rank[0])
    for start in range(0, n_micro, gradient_accumulation_steps):
        idx = range(start, min(start + gradient_accumulation_steps, n_micro))
        xs = torch.cat([per_rank[r][i][0] for r in range(world) for i in idx])
        opt.zero_grad()
        F.mse_loss(m(xs), 0 * xs).backward()
        opt.step()

def train(model, optimizer, loader):
    n_micro = len(loader)
    for micro_step, (X, Y) in enumerate(loader):
        last_in_window = (micro_step + 1) % gradient_accumulation_steps == 0 or micro_step == n_micro - 1
        loss = F.mse_loss(model(X), Y) / gradient_accumulation_steps
        loss.backward()
        if not last_in_window:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
"""
    found = [f.code for f in lint_source(textwrap.dedent(src))]
    assert found == ["AG141"], found
