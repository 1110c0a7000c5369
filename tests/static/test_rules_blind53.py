"""Shapes from blind round 53 (lint):

- a factory returning nested tuples (``(o1, o2), (s1, s2) = optimizers(m)``) gives each name
  its kind, so a reference loop stepping ``r1.step(); ...; r1.zero_grad()`` on whole windows is
  K = 1, not a window with zero_grad and clipping on every micro-batch (a_c03);
- a reference model named through an alias of a deep copy (``ref = init``) is a plain
  single-process model: its division by the window's count is no rank-local mean (a_b02_fixed);
- ``num_items_in_batch`` handed to a helper that never reads the parameter is not used: the
  ``compute_loss`` returns a per-micro-batch mean (a_b01, AG118)."""

from __future__ import annotations

import textwrap

from accumguard.static.lint import lint_source


def _codes(src: str) -> list[str]:
    return sorted(f.code for f in lint_source(textwrap.dedent(src)))


_FACTORY = """
import contextlib
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def optimizers(m):
    o1 = torch.optim.AdamW(m.body.parameters(), lr=1e-3)
    o2 = torch.optim.SGD(m.head.parameters(), lr=0.1)
    s1 = torch.optim.lr_scheduler.StepLR(o1, 1)
    s2 = torch.optim.lr_scheduler.StepLR(o2, 1)
    return (o1, o2), (s1, s2)


def worker(model, ref, loader, shards, n_steps):
    W, K, B = CFG["world"], CFG["K"], CFG["B"]
    ddp = DDP(model)
    (o1, o2), (s1, s2) = optimizers(model)
    for win in windows(loader, K):
        for i, b in enumerate(win):
            ctx = ddp.no_sync() if i < len(win) - 1 else contextlib.nullcontext()
            with ctx:
                ddp(b).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        o1.step(); o2.step(); s1.step(); s2.step()
        o1.zero_grad(); o2.zero_grad()
    (r1, r2), (rs1, rs2) = optimizers(ref)
    for t in range(n_steps):
        mbs = [b for r in range(W) for b in shards[r][t]]
        N = sum(targets(b) for b in mbs)
        (sum(ref(b).sum() for b in mbs) / N).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        r1.step(); r2.step(); rs1.step(); rs2.step(); r1.zero_grad(); r2.zero_grad()
"""


def test_nested_factory_tuples_name_optimizers() -> None:
    codes = _codes(_FACTORY)
    assert "AG102" not in codes and "AG105" not in codes, codes


_ALIAS = """
import copy
import torch
from accelerate import Accelerator


def main(model, loader, rows, K, mult_fn):
    acc = Accelerator(gradient_accumulation_steps=K)
    init = copy.deepcopy(model)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters()))
    for batch in loader:
        with acc.accumulate(model):
            acc.backward(summed_ce(model, batch) * mult_fn(batch))
            opt.step()
            opt.zero_grad()
    ref = init
    ropt = torch.optim.AdamW(ref.parameters())
    for win in rows:
        N = sum(int(b["labels"].ne(-100).sum()) for b in win)
        (sum(summed_ce(ref, b) for b in win) / N).backward()
        ropt.step()
        ropt.zero_grad()
"""


def test_an_alias_of_a_deep_copy_is_a_plain_reference() -> None:
    assert "AG113" not in _codes(_ALIAS)


_DROPPED = """
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def token_loss(logits, labels, num_items=None):
    mask = labels.ne(-100)
    per_tok = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    return per_tok.sum() / {divisor}


class MyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = token_loss(outputs.logits, labels, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="o", gradient_accumulation_steps=4)
MyTrainer(model=model, args=args, train_dataset=ds).train()
"""


def test_num_items_handed_to_a_helper_that_drops_it() -> None:
    assert "AG118" in _codes(_DROPPED.replace("{divisor}", "mask.sum()"))
    assert "AG118" not in _codes(_DROPPED.replace("{divisor}", "num_items"))
