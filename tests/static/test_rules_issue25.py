"""Issue 25's lint shapes, each against its correct twin: a backward helper called once per
micro-step (its clip/step/zero_grad counted at the call), schedule horizons (AG124 in
micro-batches, AG125 an Accelerate scheduler sized per process), FSDP2's bf16
``reduce_dtype`` with the sync deferred (AG126, its severity from K), a loss term added
undivided beside one divided by K (AG127), a tail leak behind a boundary flag (AG117)."""

from __future__ import annotations

import textwrap

import pytest

from accumguard.static.lint import lint_source


def found(src: str, select: str | None = None) -> list[tuple[str, int, str]]:
    out = lint_source(textwrap.dedent(src), select=[select] if select else None)
    return [(f.code, f.line or 0, f.severity.value) for f in out]


def errors(src: str) -> list[tuple[str, int, str]]:
    return [f for f in found(src) if f[2] == "error"]


# ---------------------------------------------------------------- backward helpers

_HELPER = """
import torch
accum_steps = 4

def backward(model, loss):
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

{loops}
"""

_ACCUM_LOOP = """
for step in range(10):
    for micro in range(accum_steps):
        backward(model, model(x).mean() / accum_steps)
    optimizer.step()
    optimizer.zero_grad()
"""

_K1_LOOP = """
for x in warmup:
    backward(model, model(x).mean())
    optimizer.step()
    optimizer.zero_grad()
"""


def test_helper_clip_is_found_in_the_accumulating_loop_once() -> None:
    both = _HELPER.format(loops=_K1_LOOP + _ACCUM_LOOP)
    assert errors(both) == [("AG105", 7, "error")]
    assert errors(_HELPER.format(loops=_ACCUM_LOOP)) == [("AG105", 7, "error")]


def test_helper_in_a_k1_loop_only_is_silent() -> None:
    assert errors(_HELPER.format(loops=_K1_LOOP)) == []


def test_helper_guarded_by_the_call_site_or_its_own_if() -> None:
    at_call = """
    def step_all(model, opt):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    def backward(loss, model, opt, i, K):
        loss.backward()
        if (i + 1) % K == 0:
            step_all(model, opt)

    accumulation_steps = 4
    for i, b in enumerate(loader):
        backward(model(b).mean() / accumulation_steps, model, opt, i, accumulation_steps)
    """
    assert errors(at_call) == []
    own_if = """
    class T:
        def __init__(self, grad_accum):
            self.grad_accum = grad_accum

        def _bw(self, loss, i):
            (loss / self.grad_accum).backward()
            if (i + 1) % self.grad_accum == 0:
                self.opt.step()
                self.opt.zero_grad()

        def fit(self, loader):
            for i, b in enumerate(loader):
                self._bw(self.model(b).mean(), i)
    """
    assert errors(own_if) == []
    unguarded = own_if.replace("            if (i + 1) % self.grad_accum == 0:\n", "            if True:\n")
    assert [c for c, _, _ in errors(unguarded)] == ["AG101"]


def test_helper_stepping_under_the_boundary_branch_of_its_call_is_guarded() -> None:
    src = """
    import torch
    accumulation_steps = 4

    def last_backward(loss):
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    for i, b in enumerate(loader):
        loss = model(b).mean() / accumulation_steps
        if (i + 1) % accumulation_steps == 0:
            last_backward(loss)
        else:
            loss.backward()
    """
    assert errors(src) == []
    unguarded = src.replace("        if (i + 1) % accumulation_steps == 0:\n            last_backward(loss)\n"
                            "        else:\n            loss.backward()\n", "        last_backward(loss)\n")
    assert [c for c, _, _ in errors(unguarded)] == ["AG101"]


def test_a_name_defined_twice_is_not_followed() -> None:
    src = _HELPER.format(loops=_ACCUM_LOOP) + "\ndef backward(model, loss):\n    loss.backward()\n"
    assert errors(src) == []


# ---------------------------------------------------------------- AG124 / AG125

_HORIZON = """
import torch
ACCUM = 4
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max={horizon})
for epoch in range(3):
    for i, (x, y) in enumerate(loader):
        (model(x).mean() / ACCUM).backward()
        if (i + 1) % ACCUM == 0 or i + 1 == len(loader):
            opt.step()
            sched.step()
            opt.zero_grad()
"""


@pytest.mark.parametrize(("horizon", "codes"), [
    ("3 * len(loader)", ["AG124"]),
    ("3 * len(loader) // ACCUM", []),
    ("3 * math.ceil(len(loader) / ACCUM)", []),
    ("3 * len(other_loader)", []),  # not the loader the window iterates
    ("args.max_steps", []),
])
def test_horizon_in_micro_batches(horizon: str, codes: list[str]) -> None:
    assert [c for c, _, _ in errors(_HORIZON.format(horizon=horizon))] == codes


def test_horizon_with_the_scheduler_stepped_per_micro_batch_is_ag103_not_ag124() -> None:
    src = _HORIZON.format(horizon="3 * len(loader)").replace(
        "            sched.step()\n", "").replace("        (model(x)", "        sched.step()\n        (model(x)")
    assert [c for c, _, _ in errors(src)] == ["AG103"]


_ACCEL = """
import math
from accelerate import Accelerator
from transformers import get_linear_schedule_with_warmup
accelerator = Accelerator(gradient_accumulation_steps=4{extra})
steps = 2 * math.ceil(len(loader) / accelerator.num_processes / 4)
sched = get_linear_schedule_with_warmup(opt, 1, {horizon})
model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
for x, y in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(x).mean())
        opt.step(); sched.step(); opt.zero_grad()
"""


@pytest.mark.parametrize(("extra", "horizon", "codes"), [
    ("", "steps", ["AG125"]),
    ("", "steps * accelerator.num_processes", []),
    (", split_batches=True", "steps", []),
    # (unlinked from the optimizer, the prepared scheduler steps on every call: AG103)
    (", step_scheduler_with_optimizer=False", "steps", ["AG103"]),
    ("", "2 * math.ceil(len(loader) / 4)", []),
])
def test_accelerate_horizon_per_process(extra: str, horizon: str, codes: list[str]) -> None:
    assert [c for c, _, _ in errors(_ACCEL.format(extra=extra, horizon=horizon))] == codes


def test_unprepared_scheduler_sized_per_process_is_silent() -> None:
    src = _ACCEL.format(extra="", horizon="steps").replace(", sched = accelerator", " = accelerator").replace(
        "model, opt, loader = accelerator.prepare(model, opt, loader, sched)",
        "model, opt, loader = accelerator.prepare(model, opt, loader)")
    assert "AG125" not in [c for c, _, _ in found(src)]


# ---------------------------------------------------------------- AG126

_FSDP = """
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
K = {k}
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16{reduce})
fully_shard(model, mp_policy=mp)
for step in range(3):
    for micro in range(K):
        model.set_requires_gradient_sync(micro == K - 1)
        (model(x).mean() / K).backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize(("k", "reduce", "expected"), [
    (3, "", [("AG126", 5, "warning")]),
    (3, ", reduce_dtype=torch.bfloat16", [("AG126", 5, "warning")]),
    (4, ", reduce_dtype=torch.bfloat16", [("AG126", 5, "error")]),
    (256, "", [("AG126", 5, "error")]),
    (256, ", reduce_dtype=torch.float32", []),
    (1, "", []),
])
def test_fsdp2_low_precision_reduce(k: int, reduce: str, expected: list[tuple[str, int, str]]) -> None:
    assert found(_FSDP.format(k=k, reduce=reduce), select="AG126") == expected


def test_fsdp2_bf16_reduce_without_deferred_sync_is_silent() -> None:
    src = _FSDP.format(k=256, reduce="").replace("        model.set_requires_gradient_sync(micro == K - 1)\n", "")
    assert found(src, select="AG126") == []


# ---------------------------------------------------------------- AG127

_TERMS = """
import torch.nn.functional as F
accumulation_steps = 4
for step in range(5):
    for micro in range(accumulation_steps):
        logits, aux = model(x)
{body}
        loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize(("body", "codes"), [
    ("        loss = F.cross_entropy(logits, y) / accumulation_steps + 0.01 * aux", ["AG127"]),
    ("        loss = F.cross_entropy(logits, y) / accumulation_steps\n        loss = loss + 0.01 * aux", ["AG127"]),
    ("        loss = F.cross_entropy(logits, y) / accumulation_steps\n        loss += 0.01 * aux", ["AG127"]),
    ("        loss = (F.cross_entropy(logits, y) + 0.01 * aux) / accumulation_steps", []),
    ("        loss = F.cross_entropy(logits, y) + 0.01 * aux\n        loss /= accumulation_steps", []),
    ("        loss = F.cross_entropy(logits, y) / accumulation_steps + 0.01 * aux / accumulation_steps", []),
    ("        loss = F.cross_entropy(logits, y, reduction='sum') / n_window + 0.01 * aux / accumulation_steps", []),
    ("        loss = F.cross_entropy(logits, y) / accumulation_steps + 0 * aux.sum()", []),
    # a term added under a setting (not the step): undivided whenever that branch runs
    ("        loss = F.cross_entropy(logits, y) / accumulation_steps\n        if use_aux:\n"
     "            loss = loss + 0.01 * aux", ["AG127"]),
    # ... but added once per window, at the boundary: its full weight, right
    ("        loss = F.cross_entropy(logits, y) / accumulation_steps\n"
     "        if micro == accumulation_steps - 1:\n            loss = loss + 0.01 * aux", []),
])
def test_loss_term_not_divided_by_k(body: str, codes: list[str]) -> None:
    assert [c for c, _, _ in errors(_TERMS.format(body=body))] == codes


# ---------------------------------------------------------------- AG117 behind a flag

def test_tail_leak_behind_a_boundary_flag() -> None:
    src = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    K = 4
    loader = DataLoader(TensorDataset(torch.randn(40, 3)), batch_size=4)
    for epoch in range(2):
        for i, (x,) in enumerate(loader):
            (model(x).mean() / K).backward()
            ready = (i + 1) % K == 0
            if ready:
                opt.step()
                opt.zero_grad()
    """
    assert found(src, select="AG117") == [("AG117", 10, "error")]
    flushed = src.replace("ready = (i + 1) % K == 0", "ready = (i + 1) % K == 0 or i + 1 == len(loader)")
    assert found(flushed, select="AG117") == []


# ---------------------------------------------------------------- AG127, Lightning manual

_LIGHTNING_MANUAL = """
import torch.nn.functional as F
import pytorch_lightning as pl

class Lit(pl.LightningModule):
    def __init__(self, accumulate=4):
        super().__init__()
        self.automatic_optimization = {automatic}
        self.accumulate = accumulate

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        pred, aux = self.net(batch[0])
        loss = F.mse_loss(pred, batch[1]) / self.accumulate
        loss = loss + 0.1 * aux
        self.manual_backward(loss)
        if (batch_idx + 1) % self.accumulate == 0:
            opt.step()
            opt.zero_grad()
"""


def test_loss_term_not_divided_by_k_in_lightning_manual_optimisation() -> None:
    """Lightning divides nothing a module backwards itself: the undivided router term weighs
    K times (blind round 24, b09); the same lines with the sum divided are silent."""
    src = _LIGHTNING_MANUAL.format(automatic="False")
    assert [(c, s) for c, _, s in found(src, select="AG127")] == [("AG127", "error")]
    fixed = src.replace("loss = loss + 0.1 * aux", "loss = loss + 0.1 * aux / self.accumulate")
    assert found(fixed, select="AG127") == []
