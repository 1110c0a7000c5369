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


_HELPER_FLAG = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def summed_ce(model, batch):
    return model(batch["x"]).sum()


def micro_step(ddp_model, batch, scale, is_last):
    {first}
    {second}
    loss.backward()


def main(model, data, K, steps):
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        for i, b in enumerate(data[step]):
            micro_step(ddp, b, 1.0 / K, i == K - 1)
        opt.step()
        opt.zero_grad()
"""


def test_sync_flag_set_after_a_forward_in_the_same_helper() -> None:
    """blind 53 a_b03: the helper runs the forward through a loss function, then sets the flag
    from its parameter, which its one call site gives as ``i == K - 1``."""
    loss = "loss = summed_ce(ddp_model, batch) * scale"
    flag = "ddp_model.require_backward_grad_sync = is_last"
    late = _codes(_HELPER_FLAG.replace("{first}", loss).replace("{second}", flag))
    early = _codes(_HELPER_FLAG.replace("{first}", flag).replace("{second}", loss))
    assert "AG106" in late and "AG106" not in early


_DS_CLASS = """
import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F

MICRO, K, STEPS = 2, 4, 3


class Trainer:
    def __init__(self, model, cfg):
        opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg["ds"])

    def compute_loss(self, batch):
        ids, labels = batch
        return F.cross_entropy(self.engine(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)

    def train(self, windows):
        for window in windows:
            for k in range(K):
                loss = self.compute_loss(window[k])
                self.engine.backward(loss)
                self.engine.step()


def main(model, windows):
    cfg = {"lr": 1e-3, "ds": {"train_micro_batch_size_per_gpu": MICRO,
                              "gradient_accumulation_steps": K, "gradient_clipping": 0.0}}
    Trainer(model, cfg).train(windows)
"""


def test_a_deepspeed_config_handed_through_a_trainer_constructor() -> None:
    """blind 53 b_b03: ``config=cfg["ds"]`` with ``cfg`` the constructor's parameter, given a
    literal by its one caller; GA is a module constant. The engine divides a token mean by K."""
    assert "AG104" in _codes(_DS_CLASS)


_MULT = """
import contextlib
import torch
from accelerate import Accelerator


def loss_multiplier(batch_samples, accelerator, grad_accum):
    n = torch.stack([b["labels"].ne(-100).sum() for b in batch_samples]).sum()
{gather}    return grad_accum{world} / n


def main(model, loader, K, updates):
    acc = Accelerator()
    opt = torch.optim.AdamW(model.parameters())
    model, opt, loader = acc.prepare(model, opt, loader)
    it = iter(loader)
    for update in range(updates):
        batch_samples = [next(it) for _ in range(K)]
        mult = loss_multiplier(batch_samples, acc, K)
        for i, batch in enumerate(batch_samples):
            ctx = acc.no_sync(model) if i < len(batch_samples) - 1 else contextlib.nullcontext()
            with ctx:
                loss = summed_token_ce(model, batch) * mult
                acc.backward(loss)
        opt.step()
        opt.zero_grad()
"""


def test_a_rank_local_count_in_a_multiplier_helper() -> None:
    """blind 53 a_b02: the Accelerate token recipe with the window's count made in a helper
    that never gathers it over the ranks."""
    local = _MULT.replace("{gather}", "").replace("{world}", "")
    gathered = _MULT.replace("{gather}", "    n = accelerator.gather(n).sum()\n").replace(
        "{world}", " * accelerator.num_processes")
    assert "AG113" in _codes(local) and "AG113" not in _codes(gathered)


def test_a_count_derived_from_an_all_reduced_one_spans_the_ranks() -> None:
    """blind 54 c_b02_fixed: ``denom = cnt / world`` after ``dist.all_reduce(cnt)``."""
    src = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(model, stream, K, world):
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    denom = None
    for i, (step, m, batch) in enumerate(stream):
        if m == 0:
            cnt = torch.tensor(float(count_tokens(step)))
            dist.all_reduce(cnt)
            denom = {denom}
        loss = ctc_sum(ddp, *batch) / denom
        loss.backward()
        if (i + 1) % K == 0:
            opt.step()
            opt.zero_grad()
"""
    assert "AG113" not in _codes(src.replace("{denom}", "cnt / world"))
    assert "AG113" in _codes(src.replace("{denom}", "float(count_tokens(step))"))


def test_a_sum_through_a_helper_tuple_is_a_micro_batch_mean() -> None:
    """blind 54 a_b02: ``total, n_tok = lm_terms(...)`` then ``total / n_tok``, the helper
    returning ``ce + coef * z, valid.sum()`` with ``ce`` a summed cross-entropy."""
    src = """
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments


def lm_terms(logits, labels):
    valid = labels.ne(-100)
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    z = (logits.logsumexp(-1) ** 2 * valid).sum()
    return ce + 1e-4 * z, valid.sum()


class ZTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        total, n_tok = lm_terms(outputs.logits, labels)
        loss = total / {denom}
        return (loss, outputs) if return_outputs else loss


args = TrainingArguments(output_dir="o", gradient_accumulation_steps=4)
ZTrainer(model=model, args=args, train_dataset=ds).train()
"""
    assert "AG118" in _codes(src.replace("{denom}", "n_tok"))
    assert "AG118" not in _codes(src.replace("{denom}", "num_items_in_batch"))


def test_a_factory_with_a_nested_function_still_names_its_returns() -> None:
    """blind 56 c_c01: ``make_opt`` defines ``lr_lambda`` inside and returns ``opt, sched``;
    the nested function's ``return`` is not the factory's, so the reference loop's
    ``ropt``/``rsched`` are an optimizer and a scheduler stepped on whole windows."""
    src = """
import torch

K = 3


def make_opt(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def lr_lambda(step):
        return min(1.0, (step + 1) / 5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    return opt, sched


def main(model, ref, wins):
    opt, sched = make_opt(model)
    for i, (x, y) in enumerate(stream(wins)):
        (model(x).sum() / K).backward()
        if (i + 1) % K == 0:
            opt.step()
            sched.step()
            opt.zero_grad()
    ropt, rsched = make_opt(ref)
    for w in wins:
        ropt.zero_grad(set_to_none=True)
        ref(torch.cat(w)).sum().backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ropt.step(); rsched.step()
"""
    codes = _codes(src)
    assert not {"AG102", "AG103", "AG105"} & set(codes), codes


def test_round_56_engine_shapes_on_correct_code() -> None:
    """blind 56: a scheduler stepped under ``if engine.was_step_applied():`` (b_b03_fixed), a
    loss times ``world / n_window`` with ``n_window`` counting every rank (b_c02), and a
    window count kept on ``self`` from a method that all-reduces it (b_c01): no finding."""
    ds = """
import deepspeed
import torch.nn as nn

def main(model, opt, sched, cfg, steps, K):
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    for s in range(steps):
        for k in range(K):
            engine.backward(nn.functional.mse_loss(engine(x(s, k)), y(s, k)))
            engine.step()
            if engine.was_step_applied():
                sched.step()
"""
    assert "AG103" not in _codes(ds)
    ddp = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def main(model, plan, it, micro_bs, world):
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for size in plan:
        n_window = size * micro_bs * world
        for j in range(size):
            x, y = next(it)
            ddp.require_backward_grad_sync = j == size - 1
            loss = ((ddp(x) - y) ** 2).sum() * (world / n_window)
            loss.backward()
        opt.step()
        opt.zero_grad()
"""
    assert "AG112" not in _codes(ddp)
    field = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

class Trainer:
    def __init__(self, model, K):
        self.model, self.K, self.micro_step = DDP(model), K, 0
        self.opt = torch.optim.AdamW(self.model.parameters())
        self._window_tokens = None

    def _window_token_count(self, window):
        t = torch.tensor([float(sum(int((y != -100).sum()) for _, y in window))])
        dist.all_reduce(t)
        return t.item()

    def micro(self, window, ids, labels):
        if self.micro_step % self.K == 0:
            self._window_tokens = self._window_token_count(window)
        loss = token_loss_sum(self.model, ids, labels) * (2 / self._window_tokens)
        loss.backward()
        self.micro_step += 1
        if self.micro_step % self.K == 0:
            self.opt.step()
            self.opt.zero_grad()
"""
    assert "AG113" not in _codes(field)


def test_round_56_shapes_found() -> None:
    """blind 56 a_b02: a window drawn ahead from ``seen, it = [], iter(dl)`` with the data
    sized ``CFG["steps"] * K``; b_b01: a checkpoint written by a method the step helper calls
    at ``if boundary:`` (``boundary = (self.micro_step + 1) % K == 0``), before the
    counter's increment."""
    prefetch = """
from accelerate import Accelerator, GradientAccumulationPlugin
from torch.utils.data import DataLoader

CFG = {"steps": 3, "bs": 2}
K = 4

def main(model, opt):
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K))
    dl = DataLoader(examples(CFG["bs"] * K * CFG["steps"]), batch_size=CFG["bs"])
    model, opt, dl = acc.prepare(model, opt, dl)
    seen, it = [], iter(dl)
    for step in range(CFG["steps"]):
        window = [next(it) for _ in range(K)]
        for b in window:
            with acc.accumulate(model):
                acc.backward(model(b).sum())
                opt.step()
                opt.zero_grad()
"""
    assert "AG148" in _codes(prefetch)
    ckpt = """
import torch

class Trainer:
    def __init__(self, model, K):
        self.model, self.K, self.micro_step, self.step = model, K, 0, 0
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def save(self):
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                    "micro_step": self.micro_step}, "ck.pt")

    def resume(self):
        sd = torch.load("ck.pt")
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])
        self.micro_step = sd["micro_step"]

    def _optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad()
        self.step += 1
        if self.step == 2:
            self.save()

    def train_micro(self, x):
        boundary = (self.micro_step + 1) % self.K == 0
        (self.model(x).sum() / self.K).backward()
        if boundary:
            self._optimizer_step()
        self.micro_step += 1
"""
    assert "AG150" in _codes(ckpt)


def test_a_count_over_the_whole_window_slice_spans_the_ranks() -> None:
    """blind 57 b_c02 / b_b02_fixed: every rank holds the whole data and counts the window's
    tokens over ``y[lo:hi]`` with ``lo, hi = s * K * W * m, (s + 1) * K * W * m``: the
    window's count over all ranks, not this rank's or this micro-batch's."""
    src = """
import deepspeed
import torch.nn.functional as F

K, MICRO = 4, 2

def run_window(engine, s, x, y, rank, world):
    lo, hi = s * K * world * MICRO, (s + 1) * K * world * MICRO
    n_lab = (y[lo:hi] != -100).sum()
    with engine.coalesce_grad_reduction():
        for i in range(K):
            a = lo + (i * world + rank) * MICRO
            loss = F.cross_entropy(engine(x[a:a + MICRO]), y[a:a + MICRO], ignore_index=-100,
                                   reduction="sum")
            engine.backward(loss * world / n_lab, scale_wrt_gas=False)
    engine.step()
"""
    assert "AG113" not in _codes(src)


def test_a_sync_flag_set_through_a_setter_after_the_forward() -> None:
    """blind 57 b_b01: ``set_sync(model, True)`` (a helper assigning the flag) under ``if i ==
    K - 1:`` after the loss's forward ran in ``token_loss_sum(model, ...)``."""
    src = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def set_sync(model, flag):
    model.require_backward_grad_sync = flag


def token_loss_sum(model, x, y):
    return model(x, y).sum()


def main(base, batches, K, steps):
    model = DDP(base)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(steps):
        opt.zero_grad()
        set_sync(model, False)
        for i in range(K):
            x, y = batches[s][i]
{body}
        opt.step()
"""
    late = "\n".join(["            loss = token_loss_sum(model, x, y) / K",
                       "            if i == K - 1:",
                       "                set_sync(model, True)",
                       "            loss.backward()"])
    early = "\n".join(["            if i == K - 1:",
                        "                set_sync(model, True)",
                        "            loss = token_loss_sum(model, x, y) / K",
                        "            loss.backward()"])
    assert "AG106" in _codes(src.replace("{body}", late))
    assert "AG106" not in _codes(src.replace("{body}", early))
