"""Run by tests/accumulate/test_multinode.py under torchrun: one agent with 2 processes,
or two agents (``--nnodes 2``) with one process each, so that RANK != LOCAL_RANK.

Trains the Accumulator on DDP (uneven tokens, a partial last window, clipping and a
scheduler), then audits a correct hand-written loop in place on the same ranks, and
writes the final parameters and the audit verdict to OUT_DIR/rank-<RANK>.pt.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from accumguard import Accumulator
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss

K = 4


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TokenMLP()


def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2)


def rank_batches(rank: int, world: int) -> list:
    return make_rank_batches(seed=5, world_size=world, micro_batches=10)[rank]


def correct_loop(ctx) -> None:  # noqa: ANN001 - the audit's LoopContext
    model = DDP(ctx.model)
    opt = ctx.make_optimizer(model.parameters())
    for start in range(0, len(ctx.batches), ctx.accumulation_steps):
        window = ctx.batches[start:start + ctx.accumulation_steps]
        n = torch.tensor(float(sum(count_tokens(b) for b in window)))
        dist.all_reduce(n)
        for i, b in enumerate(window):
            last = i == len(window) - 1
            ctx_mgr = model.no_sync() if not last else torch.enable_grad()
            with ctx_mgr:
                loss_sum, _ = ctx.loss_fn(model, b)
                (loss_sum * ctx.world_size / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(build_model())
    opt = make_optimizer(list(model.parameters()))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    acc = Accumulator(model, opt, accumulation_steps=K, scheduler=sched, max_grad_norm=1.0,
                      count_fn=count_tokens)
    losses = []
    for window in acc.windows(rank_batches(rank, world)):
        for micro in window:
            with micro:
                loss_sum, _ = token_loss(model, micro.batch)
                micro.backward(loss_sum)
        losses.append(float(window.result.loss))
    params = {n: p.detach().clone() for n, p in model.module.named_parameters()}

    from accumguard.verify.audit import audit
    from accumguard.verify.contract import AuditSetup

    setup = AuditSetup(build_model=build_model, make_optimizer=make_optimizer,
                       rank_batches=rank_batches, loss_fn=token_loss, accumulation_steps=K)
    report = audit(setup, correct_loop, diagnose=False)
    out = {"params": params, "losses": losses, "audit_passed": report.passed,
           "rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]),
           "group_rank": int(os.environ.get("GROUP_RANK", -1))}
    torch.save(out, os.path.join(os.environ["OUT_DIR"], f"rank-{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
