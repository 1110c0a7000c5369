"""Metric-learning head on DeepSpeed (stage 0, fp32) with an orthogonality penalty.

Launch: torchrun --nproc-per-node 2 ... b_b01.py
"""
import argparse
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ortho-weight", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


class Embedder(nn.Module):
    def __init__(self, d_in=24, d_hid=48, d_emb=16, n_cls=6):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d_in, d_hid), nn.GELU(), nn.Linear(d_hid, d_hid), nn.GELU())
        self.proj = nn.Linear(d_hid, d_emb, bias=False)
        self.cls = nn.Linear(d_emb, n_cls)

    def forward(self, x):
        z = self.proj(self.backbone(x))
        return self.cls(F.normalize(z, dim=-1) * 4.0)


def orthogonality_penalty(weight):
    # ||W W^T - I||_F^2 on the projection rows
    gram = weight @ weight.t()
    eye = torch.eye(gram.shape[0], dtype=gram.dtype)
    return ((gram - eye) ** 2).sum()


class Trainer:
    def __init__(self, args):
        self.args = args
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        torch.manual_seed(args.seed)
        model = Embedder()
        ds_config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": args.grad_accum,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 0},
            "steps_per_print": 10_000,
        }
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
        g = torch.Generator().manual_seed(args.seed + 17)
        n = args.steps * args.grad_accum * args.micro_batch * self.world
        self.x = torch.randn(n, 24, generator=g)
        self.y = torch.randint(0, 6, (n,), generator=g)

    def micro_batches(self):
        mb, w = self.args.micro_batch, self.world
        total = self.x.shape[0] // (mb * w)
        for i in range(total):
            lo = (i * w + self.rank) * mb
            yield self.x[lo:lo + mb], self.y[lo:lo + mb]

    def _ortho_penalty(self):
        return self.args.ortho_weight * orthogonality_penalty(self.engine.module.proj.weight)

    def train(self):
        self.engine.train()
        for x, y in self.micro_batches():
            logits = self.engine(x)
            loss = F.cross_entropy(logits, y) + self._ortho_penalty()
            self.engine.backward(loss)
            self.engine.step()

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse_args()
    tr = Trainer(args)
    tr.train()
    sha = tr.final_sha()
    if tr.rank == 0:
        print(f"FINAL_SHA256 {sha}")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
