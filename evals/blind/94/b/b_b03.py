"""Tiny causal LM on ZeRO-3, token-level loss normalised over the window's labelled tokens.

Every micro-batch has a different number of supervised tokens (prompts are masked), so the
loss is a sum over tokens divided by the number of labelled tokens in the whole window,
counted over all ranks. DeepSpeed averages gradients over ranks, hence the x world size.
"""
import hashlib
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed

DS_CONFIG = json.loads("""
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 0.0,
  "zero_allow_untested_optimizer": true,
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": false,
    "contiguous_gradients": true,
    "stage3_param_persistence_threshold": 0
  },
  "steps_per_print": 100000
}
""")

VOCAB, SEQ, DIM, STEPS, SEED = 40, 16, 32, 12, 99
IGNORE = -100


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.block = nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=True)
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("causal", torch.triu(torch.full((SEQ, SEQ), float("-inf")), 1))

    def forward(self, ids):
        h = self.tok(ids) + self.pos[: ids.shape[1]]
        h = self.block(h, src_mask=self.causal[: ids.shape[1], : ids.shape[1]], is_causal=True)
        return self.head(self.ln(h))


def micro_batches(rank, n, bs):
    g = torch.Generator().manual_seed(SEED + 17 * rank)
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (bs, SEQ), generator=g)
        ids[:, 1::2] = (ids[:, 0::2] + 5) % VOCAB  # learnable structure
        labels = ids.roll(-1, dims=1)
        labels[:, -1] = IGNORE
        prompt = torch.randint(1, SEQ - 2, (bs, 1), generator=g)
        labels = labels.masked_fill(torch.arange(SEQ)[None] < prompt, IGNORE)
        yield ids, labels


def global_label_count(window):
    n = torch.tensor(float(sum(int((lab != IGNORE).sum()) for _, lab in window)))
    dist.all_reduce(n)
    return n


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=DS_CONFIG)
    K = engine.gradient_accumulation_steps()
    data = list(micro_batches(rank, STEPS * K, engine.train_micro_batch_size_per_gpu()))

    for step in range(STEPS):
        window = data[step * K:(step + 1) * K]
        n_tok = global_label_count(window)
        for ids, labels in window:
            logits = engine(ids)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                   ignore_index=IGNORE, reduction="sum")
            loss = loss * world / n_tok
            engine.backward(loss)
            engine.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {engine.global_steps}")

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
