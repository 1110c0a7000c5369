"""Self-spawned nanoGPT-style SFT on masked prompts, resumed into new objects.

Two ranks from mp.spawn, DDP with nanoGPT's `require_backward_grad_sync` toggle,
K = 3.  Prompt tokens are masked (-1), so each window's loss is a sum over the
answer tokens divided by the window's all-ranks answer-token count, times the
world size.  Rank 0 reads 3 rows per micro-batch, rank 1 reads 4.  The context is
cropped before the DDP wrap; embeddings are tied.  After 6 iterations the run
checkpoints, and new model/DDP/optimizer objects continue from the file.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PORT = 49209
WORLD = 2
K = 3
MAX_ITERS = 12
RESUME_AT = 6
CONTEXT = 20
HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "tmp_scratch", "c_c03_ckpt.pt")


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 80
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 40
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.n_head = c.n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias), nn.GELU(),
                                 nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def crop_block_size(self, block_size):
        # model surgery to decrease the block size if necessary
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def get_lr(it, base=2e-3, warmup=3, total=MAX_ITERS, floor=2e-4):
    if it < warmup:
        return base * (it + 1) / warmup
    ratio = (it - warmup) / max(1, total - warmup)
    return floor + 0.5 * (1 + math.cos(math.pi * ratio)) * (base - floor)


def sample(rank, it, micro, vocab):
    rows = 3 if rank == 0 else 4
    g = torch.Generator().manual_seed(7919 * rank + 101 * it + micro)
    seq = torch.randint(1, vocab, (rows, CONTEXT + 1), generator=g)
    seq[:, 1::2] = (seq[:, 0:-1:2] + 5) % vocab
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    prompt = torch.randint(3, 12, (rows,), generator=g)
    y[torch.arange(CONTEXT)[None, :] < prompt[:, None]] = -1
    return x, y


def build(rank):
    torch.manual_seed(4242)
    raw = GPT(GPTConfig())
    raw.crop_block_size(CONTEXT)
    model = DDP(raw)
    opt = raw.configure_optimizers(weight_decay=0.1, learning_rate=2e-3, betas=(0.9, 0.95))
    return raw, model, opt


def train(rank, raw, model, opt, start, stop):
    for it in range(start, stop):
        for group in opt.param_groups:
            group["lr"] = get_lr(it)
        window = [sample(rank, it, m, raw.config.vocab_size) for m in range(K)]
        n_ans = torch.tensor(float(sum(int((y != -1).sum()) for _, y in window)))
        dist.all_reduce(n_ans, op=dist.ReduceOp.SUM)
        for m, (x, y) in enumerate(window):
            model.require_backward_grad_sync = (m == K - 1)
            logits = model(x)
            tok_sum = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1),
                                      ignore_index=-1, reduction="sum")
            (tok_sum / n_ans * WORLD).backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def worker(rank):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)

    raw, model, opt = build(rank)
    train(rank, raw, model, opt, 0, RESUME_AT)
    if rank == 0:
        os.makedirs(os.path.dirname(CKPT), exist_ok=True)
        torch.save({"model": raw.state_dict(), "opt": opt.state_dict(), "iter": RESUME_AT}, CKPT)
    dist.barrier()
    del raw, model, opt

    raw, model, opt = build(rank)
    ckpt = torch.load(CKPT, map_location="cpu")
    raw.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    train(rank, raw, model, opt, ckpt["iter"], MAX_ITERS)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, nprocs=WORLD, join=True)
