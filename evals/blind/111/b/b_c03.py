"""Tied-embedding tagger on DeepSpeed ZeRO-3 with bf16, optimizer and schedule from
the DeepSpeed config.

* K is not written anywhere: DeepSpeed derives gradient_accumulation_steps =
  train_batch_size / (micro batch x world size) = 4
* output projection shares its weight with the input embedding
* the positional table is frozen
* WarmupCosineLR sized in optimizer steps; clipping at 0.5 is requested and acts
"""
import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

VOCAB, DIM, SEQ = 64, 32, 10
MICRO, UPDATES = 3, 7


class TiedTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.pos.weight.requires_grad_(False)
        self.mixer = nn.GRU(DIM, DIM, batch_first=True)
        self.proj = nn.Linear(DIM, DIM)
        self.lm = nn.Linear(DIM, VOCAB, bias=False)
        self.lm.weight = self.emb.weight

    def forward(self, ids):
        x = self.emb(ids) + self.pos(torch.arange(ids.size(1)))
        h, _ = self.mixer(x)
        return self.lm(torch.tanh(self.proj(h)))


def config(world):
    return {
        "train_batch_size": MICRO * 4 * world,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 100000,
            "stage3_prefetch_bucket_size": 100000,
            "stage3_param_persistence_threshold": 0,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 5e-3, "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {"total_num_steps": UPDATES, "warmup_num_steps": 2, "warmup_type": "linear"},
        },
        "steps_per_print": 10**9,
    }


def sample(step, rank):
    g = torch.Generator().manual_seed(31337 + 977 * step + rank)
    ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    tags = (ids * 5 + torch.roll(ids, 1, dims=1)) % VOCAB
    return ids, tags


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(11)
    model = TiedTagger()
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=config(world))
    assert engine.gradient_accumulation_steps() == 4

    micro = 0
    while engine.global_steps < UPDATES:
        ids, tags = sample(micro, rank)
        logits = engine(ids)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tags.reshape(-1))
        engine.backward(loss)
        engine.step()
        micro += 1

    h = hashlib.sha256()
    params = [p for _, p in engine.module.named_parameters()]
    with deepspeed.zero.GatheredParameters(params):
        for p in params:
            h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
