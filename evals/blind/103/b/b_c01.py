"""Small LM-style model on a DeepSpeed ZeRO-2 engine with a client AdamW (two groups, a
frozen positional table), gradient pre-division before the reduce, an explicit clip, and a
checkpoint/reload into a freshly built engine halfway through.
"""
import argparse
import hashlib
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

CKPT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c01_ckpt")


def cli():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--gas", type=int, default=3)
    p.add_argument("--micro_bsz", type=int, default=4)
    p.add_argument("--total_steps", type=int, default=10)
    p.add_argument("--save_at", type=int, default=5)
    return p.parse_args()


def ds_config(args):
    return {
        "train_micro_batch_size_per_gpu": args.micro_bsz,
        "gradient_accumulation_steps": args.gas,
        "gradient_clipping": 0.5,
        "prescale_gradients": True,
        "gradient_predivide_factor": 2.0,
        "zero_optimization": {"stage": 2, "contiguous_gradients": True,
                              "overlap_comm": False, "reduce_scatter": False,
                              "reduce_bucket_size": 4096},
        "steps_per_print": 10 ** 9,
    }


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d=32, ctx=10):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.mix = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        h = self.tok(ids) + self.pos(pos)[None]
        h = h + torch.tanh(self.mix(torch.cumsum(h, dim=1) / (pos[None, :, None] + 1)))
        return self.out(self.ln(h))


def build(args):
    torch.manual_seed(11)
    model = TinyLM()
    model.pos.weight.requires_grad_(False)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "ln" in n else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(args))
    return engine


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def data(rank, world, n_micro, bsz):
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, 64, (world, n_micro, bsz, 11), generator=g)
    ids[..., 1::2] = (ids[..., 0:-1:2] * 3 + 1) % 64
    return ids[rank]


def run(engine, ids, start_micro, stop_micro):
    for i in range(start_micro, stop_micro):
        x, y = ids[i, :, :-1], ids[i, :, 1:]
        logits = engine(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        engine.backward(loss)
        engine.step()


def main():
    args = cli()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    ids = data(rank, world, args.total_steps * args.gas, args.micro_bsz)

    engine = build(args)
    run(engine, ids, 0, args.save_at * args.gas)
    if rank == 0 and os.path.isdir(CKPT_DIR):
        shutil.rmtree(CKPT_DIR)
    torch.distributed.barrier()
    engine.save_checkpoint(CKPT_DIR, tag="mid")
    torch.distributed.barrier()
    del engine

    engine = build(args)   # fresh engine, different init is overwritten by the load
    engine.load_checkpoint(CKPT_DIR, tag="mid")
    assert engine.global_steps == args.save_at
    run(engine, ids, engine.global_steps * args.gas, args.total_steps * args.gas)
    assert engine.global_steps == args.total_steps

    if rank == 0:
        print(f"FINAL_SHA256 {params_sha(engine.module)}", flush=True)


if __name__ == "__main__":
    main()
