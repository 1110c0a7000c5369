# nanoGPT-style train.py on 2 torchrun ranks: fp16 autocast + GradScaler, masked (padded) documents
# of uneven length normalised over the window's all-ranks token count, clip after unscale_, and an
# in-process checkpoint/resume into freshly built objects halfway through.
import hashlib, io, math, os
from contextlib import nullcontext
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
block_size = 24
vocab_size = 96
n_layer, n_head, n_embd = 2, 4, 48
batch_size = 6
gradient_accumulation_steps = 4
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 3
lr_decay_iters = 20
max_iters = 20
resume_at = 9
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 0.25
seed = 1337
PAD = -1
# -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(block_size, block_size, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.size(1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:T, :T], need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x)).float()
        # summed token loss; the caller normalises
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1), ignore_index=PAD, reduction="sum")

    def configure_optimizers(self):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": nodecay, "weight_decay": 0.0}], lr=learning_rate, betas=(beta1, beta2))


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def get_batch(it, micro_step, rank):
    # documents of random length, right-padded; deterministic per (iter, micro_step, rank)
    g = torch.Generator().manual_seed(seed + 100000 * rank + 100 * it + micro_step)
    x = torch.randint(0, vocab_size, (batch_size, block_size), generator=g)
    y = torch.roll(x, -1, 1)
    lengths = torch.randint(3, block_size + 1, (batch_size,), generator=g)
    pad = torch.arange(block_size)[None, :] >= lengths[:, None]
    y[pad] = PAD
    y[:, -1] = PAD
    return x, y


def build(rank):
    torch.manual_seed(seed)
    model = GPT()
    model = DDP(model)
    optimizer = model.module.configure_optimizers()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    return model, optimizer, scaler


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    ctx = torch.autocast("cpu", dtype=torch.float16)
    model, optimizer, scaler = build(rank)
    iter_num = 0
    while iter_num < max_iters:
        if iter_num == resume_at:
            # save, then resume into brand new objects (as after a preemption)
            buf = io.BytesIO()
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "iter_num": iter_num}, buf)
            del model, optimizer, scaler
            buf.seek(0)
            ckpt = torch.load(buf, weights_only=True)
            model, optimizer, scaler = build(rank)
            model.module.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scaler.load_state_dict(ckpt["scaler"])
            iter_num = ckpt["iter_num"]

        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        batches = [get_batch(iter_num, m, rank) for m in range(gradient_accumulation_steps)]
        n_tok = torch.tensor(float(sum(int((y != PAD).sum()) for _, y in batches)))
        dist.all_reduce(n_tok)  # tokens in this window over all ranks
        for micro_step, (X, Y) in enumerate(batches):
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
            with ctx:
                loss = model(X, Y) * world / n_tok  # DDP averages over ranks
            scaler.scale(loss).backward()
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
