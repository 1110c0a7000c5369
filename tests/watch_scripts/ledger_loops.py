"""Loss-weight ledger cases (issue 25): one token-level loss per micro-step on 2 ranks with
uneven token counts, under DDP, FSDP2 or DeepSpeed ZeRO-2, normalised right or wrong.

usage: ledger_loops.py ENGINE MODE [OPT] [K]
  ENGINE: ddp | fsdp2 | ds | fsdp2u (FSDP2, the Linear a unit of its own under the root)
  MODE:
    mean_k        per-micro-batch mean / K (F5 with uneven counts; the classic loop)
    global        sum / all-reduced window token count x W (correct under an averaging engine)
    global_share  global with fixed counts, 12 tokens per micro-step on rank 0 and 4 on rank
                  1: at K = 2, rank 1's own share of the total is 1/K (correct)
    global_noW    sum / all-reduced window token count, then the engine averages (F10: W x small)
    div_w         sum / window count of this rank / W (rank-local normalisation and /W: F10)
    local         sum / this rank's window token count (F6: ranks weighted unequally)
    equal_div_w   equal counts, mean / K / W (F10: W x too small)
    equal         equal counts, mean / K (correct)
    coef          equal counts, 0.5 * mean / K (a user's constant: not judged)
    global_aux    sum / all-reduced count + 1e-3 * z-loss, then the engine averages (F10
                  on the CE term: one term of a sum, W x too small)
    global_aux_w  (sum / all-reduced count + 1e-3 * z-loss) * W (correct CE term)
    sum_root      (fsdp2u) sum / all-reduced count, the sum reduction set on the root unit
                  only: the Linear unit still averages (F10: that unit W x too small)
    sum_all       (fsdp2u) the same with the sum reduction set on every unit (correct)
    pg_ent_own    (ddp) a policy-gradient masked sum / all-reduced count x W, minus an
                  entropy bonus that is a masked mean over this micro-batch's own tokens
                  (LOSS_SCALE: the bonus weighs K x its coefficient)
    pg_ent_window (ddp) the same bonus normalised like the objective (correct)
  OPT: sgd (default) | adamw
  K: micro-steps per optimizer step (default 3)
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ENGINE, MODE = sys.argv[1], sys.argv[2]
OPT = sys.argv[3] if len(sys.argv) > 3 else "sgd"
K = int(sys.argv[4]) if len(sys.argv) > 4 else 3
STEPS, V = 3, 11
if ENGINE == "ds":
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
else:
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = nn.Sequential(nn.Embedding(V, 16), nn.Tanh(), nn.Linear(16, V))


def make_opt(params):
    if OPT == "adamw":
        return torch.optim.AdamW(params, lr=1e-2)
    return torch.optim.SGD(params, lr=0.1)


if ENGINE == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(net)
    opt = make_opt(model.parameters())
elif ENGINE == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    fully_shard(net)
    model = net
    opt = make_opt(model.parameters())
elif ENGINE == "fsdp2u":
    from torch.distributed.fsdp import FSDPModule, fully_shard

    fully_shard(net[2])
    fully_shard(net)
    model = net
    units = [net] if MODE == "sum_root" else [m for m in net.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    opt = make_opt(model.parameters())
else:
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": K,
           "train_batch_size": K * world, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    model, opt, _, _ = deepspeed.initialize(model=net, optimizer=make_opt(net.parameters()),
                                            config=cfg)

g = torch.Generator().manual_seed(7 + rank)
equal = MODE.startswith("equal") or MODE == "coef"


def batch():
    x = torch.randint(0, V, (3, 6), generator=g)
    y = torch.randint(0, V, (3, 6), generator=g)
    if MODE == "global_share":
        y.view(-1)[:6 if rank == 0 else 14] = -100
    elif not equal:
        n_pad = int(torch.randint(0, 14, (1,), generator=g))
        y.view(-1)[:n_pad] = -100
    return x, y


for _step in range(STEPS):
    window = [batch() for _ in range(K)]
    local = sum(int((y != -100).sum()) for _, y in window)
    n = torch.tensor(float(local))
    dist.all_reduce(n)  # the window's token count over ranks
    for i, (x, y) in enumerate(window):
        last = i == K - 1
        if ENGINE == "ddp" and not last:
            ctx = model.no_sync()
        else:
            import contextlib

            ctx = contextlib.nullcontext()
        if ENGINE.startswith("fsdp2"):
            model.set_requires_gradient_sync(last)
        with ctx:
            logits = model(x).reshape(-1, V)
            if MODE in ("mean_k", "equal"):
                loss = F.cross_entropy(logits, y.reshape(-1)) / K
            elif MODE == "coef":
                loss = 0.5 * F.cross_entropy(logits, y.reshape(-1)) / K
            elif MODE == "equal_div_w":
                loss = F.cross_entropy(logits, y.reshape(-1)) / K / world
            elif MODE in ("global", "global_share"):
                loss = F.cross_entropy(logits, y.reshape(-1), reduction="sum") / n * world
            elif MODE in ("global_noW", "sum_root", "sum_all"):
                loss = F.cross_entropy(logits, y.reshape(-1), reduction="sum") / n
            elif MODE in ("global_aux", "global_aux_w"):
                z_loss = logits.logsumexp(-1).pow(2).mean() / K  # per micro-batch, by hand
                ce = F.cross_entropy(logits, y.reshape(-1), reduction="sum")
                loss = ce / n + 1e-3 * z_loss
                if MODE == "global_aux_w":
                    loss = loss * world
            elif MODE in ("pg_ent_own", "pg_ent_window"):
                mask = (y.reshape(-1) != -100).float()
                logp = logits.log_softmax(-1)
                chosen = logp.gather(-1, y.reshape(-1).clamp(min=0)[:, None]).squeeze(-1)
                ent = -(logp.exp() * logp).sum(-1)
                loss = (-chosen * mask).sum() / n * world
                if MODE == "pg_ent_own":
                    loss = loss - 0.05 * (ent * mask).sum() / mask.sum()
                else:
                    loss = loss - 0.05 * (ent * mask).sum() / n * world
            elif MODE == "div_w":
                loss = F.cross_entropy(logits, y.reshape(-1), reduction="sum") / local / world
            elif MODE == "local":
                loss = F.cross_entropy(logits, y.reshape(-1), reduction="sum") / local
            else:
                raise SystemExit(f"unknown mode {MODE}")
            if ENGINE == "ds":
                # DeepSpeed divides by its configured GA itself (scale_wrt_gas): every mode
                # is written as a window-normalised loss above, so hand it K x that
                model.backward(loss * K)
                model.step()  # the engine's own boundary: it steps on the K-th call
            else:
                loss.backward()
    if ENGINE != "ds":
        opt.step()
        opt.zero_grad(set_to_none=True)
dist.barrier()
if rank == 0:
    print("trained")
dist.destroy_process_group()
