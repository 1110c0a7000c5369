"""Knowledge distillation into a bf16 student with fp32 master weights.

Two ranks under torchrun, no DDP wrapper: the student runs in bfloat16, the optimizer owns
fp32 master copies, and the master gradients are averaged over the ranks once per window.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class KDArgs:
    vocab: int = 80
    seq: int = 16
    d_teacher: int = 64
    d_student: int = 32
    micro_batch: int = 4
    accum_steps: int = 16
    max_steps: int = 12
    lr: float = 5e-3
    temperature: float = 2.0
    alpha: float = 0.7
    seed: int = 2024


def mlp_lm(vocab, d, depth):
    layers = [nn.Embedding(vocab, d)]
    for _ in range(depth):
        layers += [nn.Linear(d, d), nn.GELU()]
    layers += [nn.LayerNorm(d), nn.Linear(d, vocab)]
    return nn.Sequential(*layers)


class DistillTrainer:
    def __init__(self, student, teacher, args):
        self.args = args
        self.world = dist.get_world_size()
        self.teacher = teacher.eval().requires_grad_(False)
        self.student = student.to(torch.bfloat16)
        self.names = [n for n, _ in self.student.named_parameters()]
        self.lowp = [p for _, p in self.student.named_parameters()]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.lowp]
        self.opt = torch.optim.AdamW(self.master, lr=args.lr, weight_decay=0.01)
        self.micro = 0

    def compute_loss(self, x, y):
        with torch.no_grad():
            t_logits = self.teacher(x).float()
        s_logits = self.student(x).float()
        T = self.args.temperature
        kd = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1),
                      reduction="none", log_target=True).sum(-1).mean() * T * T
        ce = F.cross_entropy(s_logits.reshape(-1, s_logits.size(-1)), y.reshape(-1))
        return self.args.alpha * kd + (1 - self.args.alpha) * ce

    def training_step(self, x, y):
        loss = self.compute_loss(x, y)
        (loss / self.args.accum_steps).backward()
        self._grads_to_master()
        self.micro += 1
        return loss.detach()

    def _grads_to_master(self):
        for m, p in zip(self.master, self.lowp):
            g = p.grad.float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

    def optimizer_step(self):
        for m in self.master:
            dist.all_reduce(m.grad)
            m.grad.div_(self.world)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, p in zip(self.master, self.lowp):
                p.copy_(m)

    def fit(self, batches):
        K = self.args.accum_steps
        step = 0
        for i, (x, y) in enumerate(batches):
            loss = self.training_step(x, y)
            if self.micro % K == 0:
                self.optimizer_step()
                step += 1
                if dist.get_rank() == 0 and step % 4 == 0:
                    print(f"step {step} loss {loss.item():.4f}", flush=True)
                if step == self.args.max_steps:
                    break

    def final_state(self):
        return dict(zip(self.names, self.master))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    args = KDArgs()
    torch.manual_seed(args.seed)
    teacher = mlp_lm(args.vocab, args.d_teacher, 2)
    student = mlp_lm(args.vocab, args.d_student, 1)
    n = args.max_steps * args.accum_steps * args.micro_batch * world
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randint(0, args.vocab, (n, args.seq), generator=g)
    y = (x * 3 + 1) % args.vocab
    x, y = x[rank::world], y[rank::world]
    batches = [(x[i:i + args.micro_batch], y[i:i + args.micro_batch])
               for i in range(0, x.size(0), args.micro_batch)]
    trainer = DistillTrainer(student, teacher, args)
    trainer.fit(batches)
    if rank == 0:
        state = trainer.final_state()
        h = hashlib.sha256()
        for name in trainer.names:
            h.update(state[name].detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        os.makedirs("/tmp/c83_params", exist_ok=True)
        torch.save({k: v.detach().clone() for k, v in state.items()},
                   f"/tmp/c83_params/{os.path.basename(__file__)[:-3]}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
