"""DeepSpeed ZeRO-3 trainer for a tiny encoder with a frozen embedding table.

Accumulation, clipping and the warm-up/decay schedule all live in the engine
config; the client optimizer has two parameter groups (no decay on norms and
biases).  Loop: engine(x) -> engine.backward -> engine.step on every micro-batch.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

SEED = 21
VOCAB, DIM, SEQ = 64, 32, 12
MICRO, GA, UPDATES = 4, 3, 9


def make_config(world):
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GA,
        "train_batch_size": MICRO * GA * world,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 3, "overlap_comm": False,
                              "stage3_param_persistence_threshold": 0},
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-3,
                                 "warmup_num_steps": 2, "total_num_steps": UPDATES,
                                 "warmup_type": "linear"}},
        "steps_per_print": 10 ** 9,
    }


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.tok.weight.requires_grad_(False)          # frozen pretrained table
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.ln1 = nn.LayerNorm(DIM)
        self.ff = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.ReLU(), nn.Linear(2 * DIM, DIM))
        self.ln2 = nn.LayerNorm(DIM)
        self.cls = nn.Linear(DIM, 4)

    def forward(self, x):
        h = self.tok(x) + self.pos
        a, _ = self.attn(h, h, h, need_weights=False)
        h = self.ln1(h + a)
        h = self.ln2(h + self.ff(h))
        return self.cls(h.mean(1))


def param_groups(model):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or n.startswith("pos") else decay).append(p)
    return [{"params": decay, "weight_decay": 0.1},
            {"params": no_decay, "weight_decay": 0.0}]


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(SEED)
    model = Encoder()
    opt = torch.optim.AdamW(param_groups(model), lr=2e-3, betas=(0.9, 0.98))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                           config=make_config(world))
    g = torch.Generator().manual_seed(SEED + 1000 + rank)
    n_micro = UPDATES * GA
    xs = torch.randint(0, VOCAB, (n_micro, MICRO, SEQ), generator=g)
    ys = (xs[..., :4].sum(-1) % 4)
    for i in range(n_micro):
        logits = engine(xs[i])
        loss = F.cross_entropy(logits, ys[i])
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == UPDATES
    params = list(engine.module.named_parameters())
    h = hashlib.sha256()
    with deepspeed.zero.GatheredParameters([p for _, p in params]):
        for _, p in params:
            h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
