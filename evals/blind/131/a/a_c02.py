"""ZeRO-1 token-level LM head trainer: K = 3 lives in the DeepSpeed config, the
engine divides by K and averages over ranks, so each micro-batch's summed token
loss is scaled by K * W / (valid tokens in the whole window, all ranks).
Padded sequences of random length, a frozen embedding, two AdamW groups (no
decay on biases / norms) and a clip at 0.05 that acts.
"""
import hashlib

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, SEQ, MICRO, K, BATCHES, EPOCHS, PAD = 40, 32, 10, 4, 3, 9, 2, -100


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h = self.wte(ids)
        h = h + self.mix(h)
        return self.lm_head(self.ln_f(h))


def make_batch(epoch, index, rank):
    g = torch.Generator().manual_seed(10_000 * epoch + 10 * index + rank)
    ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    lengths = torch.randint(2, SEQ + 1, (MICRO,), generator=g)
    labels = torch.roll(ids, -1, dims=1)
    labels[torch.arange(SEQ)[None, :] >= lengths[:, None] - 1] = PAD
    return ids, labels


def param_groups(model):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(3)
    model = TinyLM()
    model.wte.weight.requires_grad_(False)
    groups = param_groups(model)
    opt = torch.optim.AdamW(groups, lr=2e-3)
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": K,
        "gradient_clipping": 0.05,
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 500_000, "allgather_bucket_size": 500_000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    for epoch in range(EPOCHS):
        for start in range(0, BATCHES, K):
            window = [make_batch(epoch, i, rank) for i in range(start, start + K)]
            n_tok = torch.tensor(float(sum((lab != PAD).sum().item() for _, lab in window)))
            dist.all_reduce(n_tok)
            for ids, labels in window:
                logits = engine(ids)
                tok_sum = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=PAD, reduction="sum")
                engine.backward(tok_sum * K * world / n_tok)
                engine.step()

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
