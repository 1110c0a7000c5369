"""nanoGPT-flavoured DDP loop (torchrun, gloo) on a tiny GRU LM.

- token-level loss normalised by the window's token count summed over all ranks
  (x world size, since DDP averages), prompts masked out with -100;
- 8 micro-batches per epoch and grad_accum 3, so every epoch ends in a 2-batch window;
- DDP's no_sync() is entered only around backward() on the accumulating micro-steps.
"""
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

vocab_size = 64
block_size = 16
micro_batch = 4
grad_accum = 3
batches_per_epoch = 8
epochs = 3
learning_rate = 1e-2
seed = 2024


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, 32)
        self.rnn = nn.GRU(32, 48, batch_first=True)
        self.lm_head = nn.Linear(48, vocab_size)

    def forward(self, idx, targets):
        h, _ = self.rnn(self.wte(idx))
        logits = self.lm_head(h)
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1),
                               ignore_index=-100, reduction="sum")


def make_rank_batches(rank):
    g = torch.Generator().manual_seed(seed + 17 * rank)
    out = []
    for _ in range(batches_per_epoch * epochs):
        x = torch.randint(0, vocab_size, (micro_batch, block_size + 1), generator=g)
        y = x[:, 1:].clone()
        prompt_len = torch.randint(1, block_size - 2, (micro_batch,), generator=g)
        pos = torch.arange(block_size)[None, :]
        y[pos < prompt_len[:, None]] = -100
        out.append((x[:, :-1].contiguous(), y))
    return out


def windows(batches):
    for ep in range(epochs):
        ep_b = batches[ep * batches_per_epoch:(ep + 1) * batches_per_epoch]
        for s in range(0, batches_per_epoch, grad_accum):
            yield ep_b[s:s + grad_accum]


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    raw = TinyLM()
    model = DDP(raw)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.1)

    for win in windows(make_rank_batches(rank)):
        n_tok = torch.tensor(sum(int((y != -100).sum()) for _, y in win), dtype=torch.float64)
        dist.all_reduce(n_tok)
        for j, (x, y) in enumerate(win):
            loss = model(x, y) * world / n_tok.item()
            if j < len(win) - 1:
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sha = param_sha(raw)
    if rank == 0:
        print(f"FINAL_SHA256 {sha}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
