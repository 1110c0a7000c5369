"""ZeRO-2 regression fine-tune with a hand-written warm-up/cosine LR (set on the engine's param groups)."""
import argparse, hashlib, math, os
import torch, torch.nn as nn
import deepspeed

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=-1)
p.add_argument("--micro_bs", type=int, default=4)
p.add_argument("--grad_accum", type=int, default=4)
p.add_argument("--max_steps", type=int, default=10)
p.add_argument("--warmup_steps", type=int, default=4)
p.add_argument("--lr", type=float, default=3e-3)
args = p.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

ds_config = {
    "train_micro_batch_size_per_gpu": args.micro_bs,
    "gradient_accumulation_steps": args.grad_accum,
    "gradient_clipping": 0.0,
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)


def lr_at(step):
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    prog = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
    return args.lr * 0.5 * (1 + math.cos(math.pi * min(prog, 1.0)))


g = torch.Generator().manual_seed(1234)
n_micro = args.max_steps * args.grad_accum
X = torch.randn(n_micro, world, args.micro_bs, 16, generator=g)
W_true = torch.randn(16, 1, generator=g)
Y = torch.sin(X @ W_true) + 0.1 * torch.randn(n_micro, world, args.micro_bs, 1, generator=g)

for i in range(n_micro):
    lr = lr_at(engine.global_steps)
    for group in engine.optimizer.param_groups:
        group["lr"] = lr
    x, y = X[i, rank], Y[i, rank]
    loss = nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()

assert engine.global_steps == args.max_steps
if rank == 0:
    flat = torch.cat([prm.detach().float().reshape(-1) for _, prm in engine.module.named_parameters()])
    print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
