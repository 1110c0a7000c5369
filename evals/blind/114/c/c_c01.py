"""Tiny GPT on a DeepSpeed ZeRO-2 engine: config-driven accumulation (3 micro-batches),
WarmupDecayLR from the config, a client AdamW with decay / no-decay groups, a frozen
token embedding, an explicit clip, and a stop/resume into a freshly built engine halfway.
"""
import argparse
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--vocab", type=int, default=80)
    p.add_argument("--d", type=int, default=48)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--micro_bs", type=int, default=4)
    p.add_argument("--gas", type=int, default=3)
    p.add_argument("--total_steps", type=int, default=8)
    p.add_argument("--stop_at", type=int, default=5)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--ckpt", default=os.path.join(HERE, "tmp_scratch", "c_c01_ckpt"))
    return p.parse_args()


class GPT(nn.Module):
    def __init__(self, vocab, d, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, idx, tgt):
        T = idx.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T)
        h = self.body(self.wte(idx) + self.wpe[:T], mask=causal, is_causal=True)
        logits = self.lm_head(self.ln(h))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))


def config(a, world):
    return {
        "train_micro_batch_size_per_gpu": a.micro_bs,
        "gradient_accumulation_steps": a.gas,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 2, "contiguous_gradients": True,
                              "overlap_comm": False, "reduce_bucket_size": 20000},
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": a.lr,
                                 "warmup_num_steps": 2, "total_num_steps": a.total_steps,
                                 "warmup_type": "linear"}},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }


def build_engine(a, world):
    torch.manual_seed(0)
    model = GPT(a.vocab, a.d, a.seq)
    model.wte.weight.requires_grad_(False)  # frozen pretrained-style table
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and n != "wpe" else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config(a, world))
    return engine


def micro_batches(a, rank, world):
    g = torch.Generator().manual_seed(99)
    n = a.total_steps * a.gas
    data = torch.randint(0, a.vocab, (n, world, a.micro_bs, a.seq + 1), generator=g)
    data[..., 1::2] = (data[..., 0:-1:2] * 5 + 3) % a.vocab
    return [(d[rank, :, :-1], d[rank, :, 1:]) for d in data]


def main():
    a = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mbs = micro_batches(a, rank, world)

    engine = build_engine(a, world)
    cursor = 0
    while engine.global_steps < a.stop_at:
        x, y = mbs[cursor]
        engine.backward(engine(x, y))
        engine.step()
        cursor += 1
    engine.save_checkpoint(a.ckpt, tag="preempt", client_state={"cursor": cursor})
    del engine
    dist.barrier()

    engine = build_engine(a, world)  # new process state, new engine
    _, client = engine.load_checkpoint(a.ckpt, tag="preempt")
    cursor = client["cursor"]
    assert cursor % a.gas == 0
    while cursor < len(mbs):
        x, y = mbs[cursor]
        engine.backward(engine(x, y))
        engine.step()
        cursor += 1

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
    dist.barrier()
    if rank == 0:
        shutil.rmtree(a.ckpt, ignore_errors=True)
        print(f"global steps {engine.global_steps}")
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
