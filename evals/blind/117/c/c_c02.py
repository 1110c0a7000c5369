"""nanoGPT-style training on 2 DDP ranks (spawned here), interrupted and resumed.

- gradient accumulation with require_backward_grad_sync on the last micro-step only
- epochs of 10 micro-batches per rank at K = 3: windows 3, 3, 3, 1; each window's loss
  is the mean over its own micro-batches
- the tied token embedding / LM head is trained by SGD with momentum, the rest by AdamW;
  the position table is frozen
- after 5 optimizer steps everything is saved, thrown away and rebuilt from disk
"""
import hashlib
import math
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PORT = 49208
block_size, vocab_size, n_embd, n_head = 16, 32, 32, 4
batch_size, gradient_accumulation_steps = 4, 3
micro_per_epoch, epochs = 10, 3
learning_rate, emb_lr, min_lr, warmup_iters = 3e-3, 0.05, 3e-4, 3
max_iters = epochs * math.ceil(micro_per_epoch / gradient_accumulation_steps)  # 12
interrupt_at = 5


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.wpe.weight.requires_grad_(False)
        self.block = nn.TransformerEncoderLayer(n_embd, n_head, 4 * n_embd, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(block_size))

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        x = self.block(x, src_mask=self.causal[:t, :t], is_causal=True)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, vocab_size), targets.reshape(-1))


def get_lr(it, base):
    if it < warmup_iters:
        return base * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr / learning_rate * base + 0.5 * (1 + math.cos(math.pi * ratio)) * \
        (base - min_lr / learning_rate * base)


def build(rank):
    torch.manual_seed(0)
    raw = GPT()
    model = DDP(raw)
    emb = [raw.wte.weight]
    rest = [p for n, p in raw.named_parameters() if p.requires_grad and n != "wte.weight"]
    adam = torch.optim.AdamW(rest, lr=learning_rate, weight_decay=0.1, betas=(0.9, 0.95))
    sgd = torch.optim.SGD(emb, lr=emb_lr, momentum=0.9)
    return raw, model, adam, sgd


def corpus(rank, world):
    g = torch.Generator().manual_seed(5)
    n = world * micro_per_epoch * batch_size
    base = torch.randint(0, vocab_size, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    seq = (base + step * torch.arange(block_size + 1)) % vocab_size
    return seq[rank::world]


def sha(m):
    h = hashlib.sha256()
    for _, p in m.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, world, ckpt_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    data = corpus(rank, world)
    raw, model, adam, sgd = build(rank)
    K = gradient_accumulation_steps
    iter_num = 0
    for epoch in range(epochs):
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(100 + epoch))
        batches = [data[order[i * batch_size:(i + 1) * batch_size]] for i in range(micro_per_epoch)]
        win_starts = list(range(0, micro_per_epoch, K))
        for w_idx, start in enumerate(win_starts):
            if (epoch, w_idx) < resume_pos.get("pos", (-1, -1)):
                continue  # already trained before the interruption
            window = batches[start:start + K]
            for opt, base in ((adam, learning_rate), (sgd, emb_lr)):
                for g in opt.param_groups:
                    g["lr"] = get_lr(iter_num, base)
            for micro_step, seq in enumerate(window):
                model.require_backward_grad_sync = (micro_step == len(window) - 1)
                loss = model(seq[:, :-1], seq[:, 1:]) / len(window)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            adam.step()
            sgd.step()
            adam.zero_grad(set_to_none=True)
            sgd.zero_grad(set_to_none=True)
            iter_num += 1
            if iter_num == interrupt_at and not resume_pos:
                nxt = (epoch, w_idx + 1)
                if rank == 0:
                    torch.save({"model": raw.state_dict(), "adam": adam.state_dict(),
                                "sgd": sgd.state_dict(), "iter_num": iter_num, "pos": nxt},
                               ckpt_path)
                dist.barrier()
                del raw, model, adam, sgd
                raw, model, adam, sgd = build(rank)
                ck = torch.load(ckpt_path)
                raw.load_state_dict(ck["model"])
                adam.load_state_dict(ck["adam"])
                sgd.load_state_dict(ck["sgd"])
                iter_num = ck["iter_num"]
                resume_pos["pos"] = tuple(ck["pos"])
    if rank == 0:
        print(f"FINAL_SHA256 {sha(raw)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


resume_pos = {}

if __name__ == "__main__":
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, os.path.join(d, "ckpt.pt")), nprocs=2, join=True)
