"""Token-level knowledge distillation of a small GRU LM into a smaller one.

Lightning Fabric, DDP on 2 CPU ranks, K micro-batches per optimizer step with the
backward sync deferred to the last micro-batch, gradient-norm clipping at 0.01.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--max-grad-norm", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


class TinyLM(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h)


class Distiller:
    def __init__(self, fabric, args):
        self.fabric, self.args = fabric, args
        torch.manual_seed(args.seed)
        self.teacher = TinyLM(args.vocab, 48).eval().requires_grad_(False)
        self.student_raw = TinyLM(args.vocab, 24)
        opt = torch.optim.AdamW(self.student_raw.parameters(), lr=args.lr, weight_decay=0.01)
        self.student, self.opt = fabric.setup(self.student_raw, opt)
        self.gen = torch.Generator().manual_seed(args.seed * 10 + fabric.global_rank)

    def next_batch(self):
        a = self.args
        return torch.randint(0, a.vocab, (a.micro_batch, a.seq_len), generator=self.gen)

    def kd_loss(self, tokens):
        T = self.args.temperature
        with torch.no_grad():
            t_logits = self.teacher(tokens)
        s_logits = self.student(tokens)
        kl = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1),
                      log_target=True, reduction="none").sum(-1)
        return kl.mean() * T * T

    def backward_micro(self, loss):
        self.fabric.backward(loss / self.args.grad_accum)

    def optimizer_step(self):
        self.fabric.clip_gradients(self.student, self.opt, max_norm=self.args.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self):
        K = self.args.grad_accum
        for step in range(self.args.steps):
            for micro in range(K):
                last = micro == K - 1
                with self.fabric.no_backward_sync(self.student, enabled=not last):
                    loss = self.kd_loss(self.next_batch())
                    self.backward_micro(loss)
            self.optimizer_step()


def main():
    args = get_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    d = Distiller(fabric, args)
    d.train()
    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in d.student_raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
