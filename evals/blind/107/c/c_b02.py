"""Tabular classifier, plain DeepSpeed ZeRO-1 engine, engine.backward / engine.step loop.

deepspeed --num_gpus 2 c_b02.py
"""
import argparse
import hashlib

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    return p.parse_args()


class Net(nn.Module):
    def __init__(self, d_in=24, d_hidden=64, n_cls=5):
        super().__init__()
        self.inp = nn.Linear(d_in, d_hidden)
        self.mid = nn.Linear(d_hidden, d_hidden)
        self.out = nn.Linear(d_hidden, n_cls)

    def forward(self, x):
        h = F.gelu(self.inp(x))
        h = F.gelu(self.mid(h)) + h
        return self.out(h)


def micro_batches(args, rank):
    g = torch.Generator().manual_seed(args.seed + 1000 * rank)
    proj = torch.randn(24, 5, generator=torch.Generator().manual_seed(args.seed))
    while True:
        x = torch.randn(args.micro_batch, 24, generator=g) * 2.0
        y = (x @ proj).argmax(-1)
        yield x, y


def ds_config(args, world):
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": args.micro_batch * args.grad_accum * world,
        # clipping is done in the training step below
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def backward_and_clip(engine, loss, max_norm):
    engine.backward(loss)
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(engine.module.parameters(), max_norm)


def sha256_params(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(args.seed)

    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(args, world))

    data = micro_batches(args, rank)
    engine.train()
    for micro in range(args.steps * args.grad_accum):
        x, y = next(data)
        loss = F.cross_entropy(engine(x), y)
        backward_and_clip(engine, loss, args.max_grad_norm)
        engine.step()
        if rank == 0 and (micro + 1) % (4 * args.grad_accum) == 0:
            print(f"micro {micro + 1} loss {loss.item():.4f}", flush=True)

    digest = sha256_params(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
