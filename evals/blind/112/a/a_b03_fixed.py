"""nanoGPT-flavoured char model on 2 DDP ranks: two optimizers (AdamW on the
matrices, Adam on embeddings/norms), EMA weights, warm-up + cosine LR,
gradient accumulation, and a simulated preemption: the run checkpoints at
iteration 10, everything is torn down, rebuilt and resumed from disk."""
import math, os, hashlib, copy, tempfile
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

vocab, block, n_embd = 32, 16, 32
batch_size, grad_accum = 4, 3
max_iters, warmup_iters, lr_decay_iters = 20, 4, 20
learning_rate, min_lr = 2e-3, 2e-4
ckpt_interval, preempt_at = 5, 10
ema_decay = 0.9


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))


def get_batch(it, micro, rank):
    g = torch.Generator().manual_seed(10_000 * it + 100 * micro + rank)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    step = torch.randint(1, 4, (batch_size, 1), generator=g)
    seq = (start + step * torch.arange(block + 1)) % vocab
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, vocab, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1 + math.cos(math.pi * min(ratio, 1.0))) * (learning_rate - min_lr)


class Run:
    def __init__(self, rank, ckpt_path):
        self.rank, self.ckpt_path = rank, ckpt_path
        torch.manual_seed(1337)
        self.raw = GPT()
        self.model = DDP(self.raw)
        mats = [p for n, p in self.raw.named_parameters() if p.dim() >= 2 and "wte" not in n and "wpe" not in n]
        rest = [p for n, p in self.raw.named_parameters() if not (p.dim() >= 2 and "wte" not in n and "wpe" not in n)]
        self.opts = [torch.optim.AdamW(mats, lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1),
                     torch.optim.Adam(rest, lr=learning_rate, betas=(0.9, 0.95))]
        self.ema = copy.deepcopy(self.raw).requires_grad_(False)
        self.iter_num = 0

    def save(self):
        if self.rank == 0:
            torch.save({"model": self.raw.state_dict(), "ema": self.ema.state_dict(),
                        "opts": [o.state_dict() for o in self.opts], "iter_num": self.iter_num}, self.ckpt_path)
        dist.barrier()

    def load(self):
        ckpt = torch.load(self.ckpt_path, weights_only=False)
        self.raw.load_state_dict(ckpt["model"])
        self.ema.load_state_dict(ckpt["ema"])
        for o, s in zip(self.opts, ckpt["opts"]):
            o.load_state_dict(s)
        self.iter_num = ckpt["iter_num"]  # the checkpointed iteration has not run yet

    def train_until(self, stop):
        while self.iter_num < stop:
            if self.iter_num % ckpt_interval == 0 and self.iter_num > 0:
                self.save()
                if self.iter_num == preempt_at and stop == preempt_at + 1:
                    return "preempted"
            lr = get_lr(self.iter_num)
            for o in self.opts:
                for g in o.param_groups:
                    g["lr"] = lr
            for micro in range(grad_accum):
                self.model.require_backward_grad_sync = micro == grad_accum - 1
                x, y = get_batch(self.iter_num, micro, self.rank)
                loss = self.model(x, y) / grad_accum
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), 1.0)
            for o in self.opts:
                o.step()
            for o in self.opts:
                o.zero_grad(set_to_none=True)
            with torch.no_grad():
                for pe, p in zip(self.ema.parameters(), self.raw.parameters()):
                    pe.lerp_(p, 1 - ema_decay)
            if self.rank == 0 and self.iter_num % 5 == 0:
                print(f"iter {self.iter_num} loss {loss.item() * grad_accum:.4f} lr {lr:.2e}", flush=True)
            self.iter_num += 1
        return "done"


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ckpt_path = os.path.join(tempfile.gettempdir(), f"a_b03_ckpt_{os.environ.get('MASTER_PORT', '0')}.pt")
    run = Run(rank, ckpt_path)
    assert run.train_until(preempt_at + 1) == "preempted"
    del run
    run = Run(rank, ckpt_path)  # fresh process state after the "restart"
    run.load()
    run.train_until(max_iters)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in run.raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
        os.remove(ckpt_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
