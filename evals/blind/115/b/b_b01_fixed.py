"""Tiny causal LM pretraining on DeepSpeed ZeRO-1 with bf16 weights.

Engine-owned AdamW + WarmupDecayLR from the JSON config; the engine handles the
gradient accumulation (GA = 8 micro-batches per rank per optimizer step).
"""
import hashlib
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed
from deepspeed.utils import safe_get_full_fp32_param

DS_CONFIG_JSON = """
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 8,
  "gradient_clipping": 0.0,
  "steps_per_print": 1000,
  "bf16": {"enabled": true},
  "data_types": {"grad_accum_dtype": "fp32"},
  "zero_optimization": {"stage": 1},
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
               "weight_decay": 0.01, "torch_adam": true, "adam_w_mode": true}
  },
  "scheduler": {
    "type": "WarmupDecayLR",
    "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
               "warmup_num_steps": 3, "total_num_steps": 12}
  }
}
"""

VOCAB, DIM, SEQ = 96, 64, 16
OPT_STEPS = 12


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.mix = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 4 * DIM), nn.GELU(),
                                 nn.Linear(4 * DIM, DIM))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.tok(ids) + self.pos(pos)[None]
        # causal prefix mean as a cheap "attention"
        w = torch.tril(torch.ones(ids.shape[1], ids.shape[1], device=ids.device, dtype=h.dtype))
        w = w / w.sum(-1, keepdim=True)
        h = h + torch.einsum("ts,bsd->btd", w, h)
        h = h + self.mix(h)
        return self.head(self.norm(h))


def make_shard(rank, world, n_micro, mbs):
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, VOCAB, (n_micro * mbs * world, SEQ + 1), generator=g)
    # learnable structure: next token = (prev * 3 + 1) % VOCAB half the time
    for t in range(1, SEQ + 1):
        keep = torch.rand(data.shape[0], generator=g) < 0.5
        data[keep, t] = (data[keep, t - 1] * 3 + 1) % VOCAB
    return data[rank::world].split(mbs)


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(0)
    np.random.seed(0)

    cfg = json.loads(DS_CONFIG_JSON)
    model = TinyLM()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    ga = engine.gradient_accumulation_steps()
    batches = make_shard(rank, world, OPT_STEPS * ga, cfg["train_micro_batch_size_per_gpu"])

    engine.train()
    for i, seq in enumerate(batches):
        ids, tgt = seq[:, :-1], seq[:, 1:]
        logits = engine(ids)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tgt.reshape(-1))
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == OPT_STEPS, engine.global_steps

    full = {n: safe_get_full_fp32_param(p).detach().float().cpu().contiguous()
            for n, p in engine.module.named_parameters()}  # collective on every rank
    h = hashlib.sha256()
    for t in full.values():
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save(full, os.environ["PARAM_DUMP"])

if __name__ == "__main__":
    main()
