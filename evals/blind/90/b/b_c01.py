# ZeRO-1 from a config dict: GA 3 owned by the engine, an explicit clip of 0.5,
# a client AdamW with decay / no-decay groups, a frozen token embedding and a client
# warm-up/decay LambdaLR handed to the engine (stepped at boundaries by DeepSpeed).
# Half-way the run checkpoints and resumes into a freshly built engine.
import hashlib
import os
import shutil

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import deepspeed

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "b_c01_ckpt")
MICRO, GA, TOTAL, SPLIT = 4, 3, 10, 5


def ds_config(world):
    return {
        "train_batch_size": MICRO * GA * world,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 1},
        "steps_per_print": 10 ** 6,
    }


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.emb.weight.requires_grad_(False)
        self.rnn_proj = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.cls = nn.Linear(32, 6)

    def forward(self, tok):
        h = torch.tanh(self.rnn_proj(self.emb(tok))).mean(1)
        return self.cls(self.norm(h))


def build(world):
    torch.manual_seed(0)
    model = Tagger()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=2e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3) * (1 - s / (TOTAL + 1)))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=ds_config(world))
    return engine


def run(engine, X, Y, start, stop):
    for step in range(start, stop):
        for k in range(GA):
            i = step * GA + k
            out = engine(X[i * MICRO:(i + 1) * MICRO])
            loss = nn.functional.cross_entropy(out, Y[i * MICRO:(i + 1) * MICRO])
            engine.backward(loss)
            engine.step()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(3)
    n = TOTAL * GA * MICRO * world
    X = torch.randint(0, 40, (n, 7), generator=g)
    Y = (X[:, 0] + 2 * X[:, -1]) % 6
    X, Y = X[rank::world], Y[rank::world]

    engine = build(world)
    run(engine, X, Y, 0, SPLIT)
    engine.save_checkpoint(CKPT, tag="mid")
    dist.barrier()
    del engine

    engine = build(world)
    engine.load_checkpoint(CKPT, tag="mid")
    run(engine, X, Y, SPLIT, TOTAL)

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
    dist.barrier()
    if rank == 0:
        shutil.rmtree(CKPT, ignore_errors=True)
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest())


if __name__ == "__main__":
    main()
