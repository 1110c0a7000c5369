"""Small causal LM on a DeepSpeed engine (ZeRO stage 0), resumed from an engine checkpoint.

Config GA = K, client AdamW with a frozen position table and a no-decay group, a client
warm-up LambdaLR handed to deepspeed.initialize (the engine steps it at each boundary),
explicit gradient clipping that acts. Half-way through, the run saves an engine checkpoint
at a step boundary, throws every object away and continues in a freshly built engine.
"""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed

CFG = dict(vocab=50, d=32, ctx=10, micro_bs=4, K=3, steps=10, save_at=5, lr=4e-3, seed=3)


class TinyLM(nn.Module):
    def __init__(self, vocab, d, ctx):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.pos.weight.requires_grad_(False)
        layer = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        T = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        return self.head(self.enc(h, mask=mask, is_causal=True))


def ds_config():
    return {
        "train_micro_batch_size_per_gpu": CFG["micro_bs"],
        "gradient_accumulation_steps": CFG["K"],
        "gradient_clipping": 0.3,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10 ** 6,
    }


def build_engine():
    torch.manual_seed(CFG["seed"])
    model = TinyLM(CFG["vocab"], CFG["d"], CFG["ctx"])
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=CFG["lr"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    engine, opt, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                                 config=ds_config())
    return engine


def batches(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    n = CFG["steps"] * CFG["K"]
    data = torch.randint(0, CFG["vocab"], (n, CFG["micro_bs"], CFG["ctx"] + 1), generator=g)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def run(engine, data, start_step, stop_step):
    K = CFG["K"]
    for i in range(start_step * K, stop_step * K):
        x, y = data[i]
        logits = engine(x)
        loss = F.cross_entropy(logits.reshape(-1, CFG["vocab"]), y.reshape(-1))
        engine.backward(loss)
        engine.step()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    data = batches(rank)
    ckpt = [tempfile.mkdtemp(prefix="c01ck_") if rank == 0 else None]
    dist.broadcast_object_list(ckpt, src=0)
    ckpt = ckpt[0]

    engine = build_engine()
    run(engine, data, 0, CFG["save_at"])
    assert engine.global_steps == CFG["save_at"]
    engine.save_checkpoint(ckpt, tag="mid")
    del engine

    engine = build_engine()
    engine.load_checkpoint(ckpt, tag="mid")
    run(engine, data, engine.global_steps, CFG["steps"])

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
