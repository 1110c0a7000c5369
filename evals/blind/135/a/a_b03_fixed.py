"""ZeRO-3 trainer: a classifier with a projection kept near-orthogonal by a soft penalty.

The penalty depends only on the weights, so it is added once per accumulation window
(on the boundary micro-batch) instead of on every micro-batch.
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--ortho-weight", type=float, default=0.5)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=21)
    return ap.parse_args()


class ProjClassifier(nn.Module):
    def __init__(self, d_in=20, d_proj=16, n_cls=5):
        super().__init__()
        self.proj = nn.Linear(d_in, d_proj, bias=False)
        self.body = nn.Sequential(nn.Linear(d_proj, 32), nn.Tanh(), nn.Linear(32, n_cls))

    def forward(self, x, y):
        w = self.proj.weight
        ortho = ((w @ w.t() - torch.eye(w.shape[0])) ** 2).sum()
        logits = self.body(self.proj(x))
        return F.cross_entropy(logits, y), ortho


class Zero3Trainer:
    def __init__(self, args):
        self.args = args
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(args.seed)
        model = ProjClassifier()
        ds_config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": args.grad_accum,
            "gradient_clipping": args.clip,
            "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.0,
                                                        "torch_adam": True}},
            "zero_optimization": {"stage": 3, "overlap_comm": False,
                                  "stage3_param_persistence_threshold": 0},
            "steps_per_print": 100000,
        }
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config)
        g = torch.Generator().manual_seed(args.seed + 5)
        n = args.micro_batch * self.world * args.grad_accum * args.updates
        self.x = torch.randn(n, 20, generator=g)
        self.y = (self.x[:, :5] * 2.0).argmax(dim=1)

    def shard_of(self, j):
        mb = self.args.micro_batch
        lo = (j * self.world + self.rank) * mb
        return self.x[lo:lo + mb], self.y[lo:lo + mb]

    def micro_step(self, j):
        xb, yb = self.shard_of(j)
        task, ortho = self.engine(xb, yb)
        # engine.backward divides every micro-batch's loss by K: add the penalty each time
        loss = task + self.args.ortho_weight * ortho
        self.engine.backward(loss)
        self.engine.step()
        return task.detach(), ortho.detach()

    def run(self):
        n_micro = self.args.grad_accum * self.args.updates
        for j in range(n_micro):
            task, ortho = self.micro_step(j)
            if self.rank == 0 and (j + 1) % (4 * self.args.grad_accum) == 0:
                print(f"update {(j + 1) // self.args.grad_accum} task {task.item():.4f} "
                      f"ortho {ortho.item():.4f}", flush=True)

    def sha256(self):
        params = list(self.engine.module.parameters())
        h = hashlib.sha256()
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            for _, p in self.engine.module.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    trainer = Zero3Trainer(get_args())
    trainer.run()
    digest = trainer.sha256()
    if trainer.rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
