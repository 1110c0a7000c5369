"""
Self-launching (mp.spawn) DDP fine-tune of a tiny GPT whose tied vocabulary is
grown from 60 to 76 tokens before training; the learned position table stays
frozen. Variable-length sequences come from a DataLoader with a worker process
and a DistributedSampler; micro-batches are padded per batch. bf16 autocast on
CPU (fp32 parameters and gradients).

8 micro-batches per rank per epoch, 3 micro-steps per update: windows 3-3-2.
Each window is read ahead so its all-ranks target-token count is known before
the first backward; the loss is the token sum x W / that count (DDP averages).

  python a_c03.py
"""
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

WORLD = 2
PORT = 49061
OLD_VOCAB, NEW_VOCAB = 60, 76
IGNORE = -100
ACCUM = 3
MICRO_BS = 4
EPOCHS = 3
SEED = 5


class VarLenDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            L = int(torch.randint(4, 33, (1,), generator=g))
            a = int(torch.randint(1, NEW_VOCAB, (1,), generator=g))
            s = (a + 3 * torch.arange(L)) % (NEW_VOCAB - 1) + 1
            m = torch.rand(L, generator=g) < 0.2
            s[m] = torch.randint(1, NEW_VOCAB, (int(m.sum()),), generator=g)
            self.items.append(s)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    T = max(len(s) for s in batch) - 1
    x = torch.zeros(len(batch), T, dtype=torch.long)
    y = torch.full((len(batch), T), IGNORE, dtype=torch.long)
    for i, s in enumerate(batch):
        x[i, : len(s) - 1], y[i, : len(s) - 1] = s[:-1], s[1:]
    return x, y


class TinyGPT(nn.Module):
    def __init__(self, vocab, d=48, layers=2, heads=4, max_len=40):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def resize_token_embeddings(self, new_vocab):
        old = self.wte.weight.data
        new = nn.Embedding(new_vocab, old.size(1))
        new.weight.data[: old.size(0)] = old
        new.weight.data[old.size(0):] = old.mean(0, keepdim=True)
        self.wte = new
        self.lm_head = nn.Linear(old.size(1), new_vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, x):
        T = x.size(1)
        h = self.wte(x) + self.wpe(torch.arange(T))
        causal = nn.Transformer.generate_square_subsequent_mask(T)
        h = self.blocks(h, mask=causal, is_causal=True)
        return self.lm_head(self.ln_f(h))


def run(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(SEED)

    model = TinyGPT(OLD_VOCAB)
    model.resize_token_embeddings(NEW_VOCAB)
    model.wpe.weight.requires_grad_(False)
    ddp = DDP(model)

    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.95))

    ds = VarLenDataset(WORLD * MICRO_BS * 8, SEED)
    sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=MICRO_BS, sampler=sampler, collate_fn=collate,
                        num_workers=1, persistent_workers=True)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        it = iter(loader)
        while True:
            window = []
            for _ in range(ACCUM):
                try:
                    window.append(next(it))
                except StopIteration:
                    break
            if not window:
                break
            n_tok = torch.tensor(float(sum(int((y != IGNORE).sum()) for _, y in window)))
            dist.all_reduce(n_tok)
            for i, (x, y) in enumerate(window):
                ctx = ddp.no_sync() if i < len(window) - 1 else nullcontext()
                with ctx:
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        logits = ddp(x)
                    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                           ignore_index=IGNORE, reduction="sum")
                    (loss * WORLD / n_tok).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                print(f"epoch {epoch} step {step} window {len(window)} tokens {int(n_tok)}")
            step += 1

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=WORLD, join=True)
