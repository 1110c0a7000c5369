"""
minGPT-style trainer on variable-length sequences, length-grouped micro-batches,
activation checkpointing on the blocks, DDP with no_sync across each window.

  torchrun --nproc-per-node 2 a_b02.py

Objective: token-level cross entropy averaged over every target token of the
optimizer step (all micro-batches of the window, all ranks).
"""
import hashlib
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

PAD = 0
IGNORE = -100


@dataclass
class GPTConfig:
    vocab_size: int = 80
    block_size: int = 64
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 64
    gradient_checkpointing: bool = True


@dataclass
class TrainerConfig:
    micro_batch_size: int = 4
    grad_accum: int = 4
    max_iters: int = 10
    learning_rate: float = 2e-3
    betas: tuple = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_norm_clip: float = 1.0
    seed: int = 3407
    num_sequences: int = 320


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = nn.MultiheadAttention(cfg.n_embd, cfg.n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x, attn_mask, key_padding_mask):
        h = self.ln_1(x)
        a, _ = self.attn(h, h, h, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                         need_weights=False)
        x = x + a
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, cfg.block_size, cfg.n_embd))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        nn.init.normal_(self.pos_emb, std=0.02)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, pad_mask):
        T = idx.size(1)
        x = self.tok_emb(idx) + self.pos_emb[:, :T]
        causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        kpm = torch.zeros(pad_mask.shape).masked_fill(pad_mask, float("-inf"))
        for blk in self.blocks:
            if self.cfg.gradient_checkpointing and self.training:
                x = checkpoint(blk, x, causal, kpm, use_reentrant=False)
            else:
                x = blk(x, causal, kpm)
        return self.head(self.ln_f(x))

    def configure_optimizers(self, tc: TrainerConfig):
        decay, no_decay = set(), set()
        for mn, m in self.named_modules():
            for pn, p in m.named_parameters(recurse=False):
                fpn = f"{mn}.{pn}" if mn else pn
                if pn.endswith("bias") or isinstance(m, (nn.LayerNorm, nn.Embedding)) or pn == "pos_emb":
                    no_decay.add(fpn)
                elif pn.endswith("weight") or "proj_weight" in pn:
                    decay.add(fpn)
        params = dict(self.named_parameters())
        assert decay | no_decay == set(params), set(params) - (decay | no_decay)
        groups = [
            {"params": [params[n] for n in sorted(decay)], "weight_decay": tc.weight_decay},
            {"params": [params[n] for n in sorted(no_decay)], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=tc.learning_rate, betas=tc.betas)


# ----------------------------------------------------------------------------- data
def make_sequences(n, vocab, max_len, seed):
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(n):
        L = int(torch.randint(6, max_len + 1, (1,), generator=g))
        start = int(torch.randint(1, vocab, (1,), generator=g))
        step = int(torch.randint(1, 4, (1,), generator=g))
        s = (start + step * torch.arange(L)) % (vocab - 1) + 1
        noise = torch.rand(L, generator=g) < 0.15
        s[noise] = torch.randint(1, vocab, (int(noise.sum()),), generator=g)
        seqs.append(s)
    return seqs


def length_grouped_batches(seqs, bs, seed):
    """Sort by length inside mega-chunks so micro-batches hold similar lengths (less padding)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(seqs), generator=g).tolist()
    mega = bs * 16
    batches = []
    for i in range(0, len(order), mega):
        chunk = sorted(order[i:i + mega], key=lambda j: -len(seqs[j]))
        batches += [chunk[k:k + bs] for k in range(0, len(chunk), bs)]
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[p] for p in perm]


def collate(seqs, idx):
    T = max(len(seqs[i]) for i in idx) - 1
    x = torch.full((len(idx), T), PAD, dtype=torch.long)
    y = torch.full((len(idx), T), IGNORE, dtype=torch.long)
    for r, i in enumerate(idx):
        s = seqs[i]
        x[r, : len(s) - 1] = s[:-1]
        y[r, : len(s) - 1] = s[1:]
    return x, y, x.eq(PAD)


# ----------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, model, tc: TrainerConfig, seqs):
        self.tc = tc
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.raw_model = model
        self.model = DDP(model)
        self.optimizer = model.configure_optimizers(tc)
        batches = length_grouped_batches(seqs, tc.micro_batch_size, tc.seed)
        self.my_batches = batches[self.rank::self.world]
        self.seqs = seqs
        self.iter_num = 0

    def micro_batches(self):
        for idx in self.my_batches:
            yield collate(self.seqs, idx)

    def compute_loss(self, logits, labels):
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        return loss / self.tc.grad_accum

    def run(self):
        tc = self.tc
        it = self.micro_batches()
        self.model.train()
        while self.iter_num < tc.max_iters:
            window = [next(it) for _ in range(tc.grad_accum)]
            n_tok = torch.tensor(float(sum(int((y != IGNORE).sum()) for _, y, _ in window)))
            dist.all_reduce(n_tok)  # tokens in this optimizer step, for throughput logging
            total = 0.0
            for i, (x, y, pad) in enumerate(window):
                last = i == len(window) - 1
                with (nullcontext() if last else self.model.no_sync()):
                    logits = self.model(x, pad)
                    loss = self.compute_loss(logits, y)
                    loss.backward()
                total += loss.item()
            gnorm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), tc.grad_norm_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.rank == 0 and self.iter_num % 3 == 0:
                print(f"iter {self.iter_num}: loss {total:.4f} tokens {int(n_tok)} gnorm {float(gnorm):.3f}")
            self.iter_num += 1


def main():
    dist.init_process_group("gloo")
    tc = TrainerConfig()
    torch.manual_seed(tc.seed)
    mc = GPTConfig()
    seqs = make_sequences(tc.num_sequences, mc.vocab_size, 48, tc.seed)
    model = GPT(mc)
    trainer = Trainer(model, tc, seqs)
    trainer.run()
    if dist.get_rank() == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
