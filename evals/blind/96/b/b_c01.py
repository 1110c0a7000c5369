"""Sequence tagger on DeepSpeed ZeRO-1 with a client optimizer and warm-up,
a frozen embedding table, and a save / reload into a fresh engine half way."""
import argparse
import hashlib
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

VOCAB, D, T, N_TAGS = 50, 24, 10, 6
HERE = os.path.dirname(os.path.abspath(__file__))
CKPT_DIR = os.path.join(HERE, "tmp_scratch", "b_c01_ckpt")


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.emb.weight.requires_grad_(False)          # pretrained table, kept fixed
        self.mix = nn.Conv1d(D, D, 3, padding=1)
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, N_TAGS)

    def forward(self, tok):
        h = self.emb(tok)
        h = h + F.gelu(self.mix(h.transpose(1, 2)).transpose(1, 2))
        return self.out(self.norm(h))


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in n else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def build_engine(args, world):
    torch.manual_seed(args.seed)
    model = Tagger()
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=args.lr, betas=(0.9, 0.98))
    warm = args.warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_bs,
        "gradient_accumulation_steps": args.accum,
        "train_batch_size": args.micro_bs * args.accum * world,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 1},
        "steps_per_print": 100000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=ds_config)
    return engine


def micro_batch(rank, i, bs):
    g = torch.Generator().manual_seed(50_000 + 97 * i + rank)
    tok = torch.randint(0, VOCAB, (bs, T), generator=g)
    tags = (tok + torch.roll(tok, 1, dims=1)) % N_TAGS
    return tok, tags


def run(engine, rank, start_micro, n_updates, args):
    i = start_micro
    while engine.global_steps < n_updates:
        tok, tags = micro_batch(rank, i, args.micro_bs)
        loss = F.cross_entropy(engine(tok).reshape(-1, N_TAGS), tags.reshape(-1))
        engine.backward(loss)
        engine.step()
        i += 1
    return i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--accum", type=int, default=3)
    ap.add_argument("--micro-bs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--save-at", type=int, default=5)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if rank == 0 and os.path.isdir(CKPT_DIR):
        shutil.rmtree(CKPT_DIR)
    if rank == 0:
        os.makedirs(CKPT_DIR, exist_ok=True)
    torch.distributed.barrier()

    engine = build_engine(args, world)
    consumed = run(engine, rank, 0, args.save_at, args)
    engine.save_checkpoint(CKPT_DIR, tag="mid", client_state={"consumed_micro": consumed})
    del engine

    engine = build_engine(args, world)          # fresh objects, state from disk
    _, client = engine.load_checkpoint(CKPT_DIR, tag="mid")
    assert engine.global_steps == args.save_at
    run(engine, rank, client["consumed_micro"], args.updates, args)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if rank == 0:
        print(f"lr {engine.get_lr()}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
