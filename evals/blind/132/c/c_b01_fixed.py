"""Logit distillation of a small causal LM student from a frozen teacher.

Ranks are spawned by this script (gloo on 127.0.0.1). There is no DDP wrapper:
each micro-batch's gradients are taken with ``torch.autograd.grad`` and added to
per-parameter accumulators, and the accumulators are averaged over the ranks
with one flat all-reduce per optimizer step.
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


@dataclass
class DistillConfig:
    vocab: int = 96
    d_model: int = 64
    n_head: int = 4
    n_layer: int = 2
    block: int = 24
    micro_bs: int = 4
    grad_accum: int = 4
    max_steps: int = 20
    lr: float = 2e-3
    weight_decay: float = 0.01
    temperature: float = 2.0
    alpha: float = 0.7
    # accumulators are kept compact: the student is tiny but the real run is not
    accum_dtype: torch.dtype = torch.float32
    world_size: int = 2
    port: int = 49212
    seed: int = 1234


class TinyLM(nn.Module):
    def __init__(self, cfg: DistillConfig, n_layer=None, d_model=None):
        super().__init__()
        d = d_model or cfg.d_model
        self.tok = nn.Embedding(cfg.vocab, d)
        self.pos = nn.Embedding(cfg.block, d)
        layer = nn.TransformerEncoderLayer(d, cfg.n_head, 4 * d, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer or cfg.n_layer,
                                            enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.vocab, bias=False)
        mask = torch.triu(torch.full((cfg.block, cfg.block), float("-inf")), 1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        h = self.blocks(h, mask=self.causal[:t, :t], is_causal=True)
        return self.head(self.ln_f(h))


def make_corpus(cfg: DistillConfig, n_rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed + 7)
    # a little structure so the teacher is not pure noise
    base = torch.randint(0, cfg.vocab, (n_rows, cfg.block + 1), generator=g)
    base[:, 1::2] = (base[:, 0::2][:, : base[:, 1::2].shape[1]] * 5 + 3) % cfg.vocab
    return base


def distill_loss(student_logits, teacher_logits, targets, cfg: DistillConfig):
    T = cfg.temperature
    kd = F.kl_div(F.log_softmax(student_logits / T, -1).flatten(0, 1),
                  F.log_softmax(teacher_logits / T, -1).flatten(0, 1),
                  log_target=True, reduction="batchmean") * T * T
    ce = F.cross_entropy(student_logits.flatten(0, 1), targets.flatten())
    return cfg.alpha * kd + (1.0 - cfg.alpha) * ce


class GradAccumulator:
    """Collects micro-batch gradients, then averages them over the ranks."""

    def __init__(self, params, dtype):
        self.params = [p for p in params if p.requires_grad]
        self.bufs = [torch.zeros_like(p, dtype=dtype) for p in self.params]

    def add(self, loss):
        grads = torch.autograd.grad(loss, self.params)
        for buf, g in zip(self.bufs, grads):
            buf.add_(g)

    def reduce_into_grad(self, world_size):
        flat = torch.cat([b.float().reshape(-1) for b in self.bufs])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= world_size
        off = 0
        for p, b in zip(self.params, self.bufs):
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p).to(p.dtype).clone()
            off += n
            b.zero_()


def params_sha256(module: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank: int, cfg: DistillConfig):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    teacher = TinyLM(cfg, n_layer=3, d_model=96).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg.seed + 1)
    student = TinyLM(cfg)

    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr,
                            weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    acc = GradAccumulator(student.parameters(), cfg.accum_dtype)

    rows_per_step = cfg.micro_bs * cfg.grad_accum * cfg.world_size
    corpus = make_corpus(cfg, rows_per_step * cfg.max_steps)
    mine = corpus[rank::cfg.world_size]          # this rank's rows
    micro_batches = mine.split(cfg.micro_bs)

    it = iter(micro_batches)
    for step in range(cfg.max_steps):
        for _ in range(cfg.grad_accum):
            xy = next(it)
            x, y = xy[:, :-1], xy[:, 1:]
            with torch.no_grad():
                t_logits = teacher(x)
            loss = distill_loss(student(x), t_logits, y, cfg)
            acc.add(loss / cfg.grad_accum)
        acc.reduce_into_grad(cfg.world_size)
        lr = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.max_steps))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    if rank == 0:
        print(f"FINAL_SHA256 {params_sha256(student)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = DistillConfig()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world_size, join=True)
