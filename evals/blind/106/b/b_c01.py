"""DeepSpeed ZeRO-0 + bf16 classifier with a frozen embedding, a config scheduler, an explicit clip,
and a save / reload into a freshly built engine half-way through (at an optimizer-step boundary)."""
import argparse
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, NCLS, SEQ = 50, 24, 4, 10


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.proj = nn.Linear(DIM, 48)
        self.norm = nn.LayerNorm(48)
        self.head = nn.Linear(48, NCLS)

    def forward(self, tok):
        h = self.emb(tok).mean(1)
        return self.head(self.norm(F.gelu(self.proj(h))))


def ds_config(args, world):
    return {
        "train_micro_batch_size_per_gpu": args.micro,
        "gradient_accumulation_steps": args.accum,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 4e-3, "betas": [0.9, 0.99], "weight_decay": 0.05,
                                                    "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 4e-3,
                                                      "warmup_num_steps": 5, "warmup_type": "linear"}},
        "steps_per_print": 10_000,
    }


def build(args, world):
    torch.manual_seed(123)
    model = BagClassifier()
    model.emb.weight.requires_grad_(False)  # frozen pretrained table
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config(args, world))
    return engine


def micro_batch(i, rank, micro):
    g = torch.Generator().manual_seed(7919 * i + rank)
    tok = torch.randint(0, VOCAB, (micro, SEQ), generator=g)
    y = (tok[:, 0] + tok[:, -1]) % NCLS
    return tok, y


def run(engine, start_micro, end_micro, rank, micro):
    for i in range(start_micro, end_micro):
        tok, y = micro_batch(i, rank, micro)
        logits = engine(tok)
        loss = F.cross_entropy(logits.float(), y)
        engine.backward(loss)
        engine.step()
    return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--micro", type=int, default=6)
    p.add_argument("--accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save_at", type=int, default=5)
    p.add_argument("--ckpt", default="b_c01_ckpt")
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)

    engine = build(args, world)
    run(engine, 0, args.save_at * args.accum, rank, args.micro)
    assert engine.global_steps == args.save_at
    engine.save_checkpoint(args.ckpt, tag="mid", client_state={"next_micro": args.save_at * args.accum})
    dist.barrier()
    del engine

    # "restart": a fresh engine from the same recipe, then reload
    engine = build(args, world)
    _, client = engine.load_checkpoint(args.ckpt, tag="mid")
    start = client["next_micro"]
    loss = run(engine, start, args.steps * args.accum, rank, args.micro)
    if rank == 0:
        print(f"steps {engine.global_steps} last loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e}")

    h = hashlib.sha256()
    for _, prm in engine.module.named_parameters():
        h.update(prm.detach().float().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        shutil.rmtree(args.ckpt, ignore_errors=True)
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
