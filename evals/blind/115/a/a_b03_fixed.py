"""Knowledge distillation of a small MLP student from a frozen teacher.

Data parallel by hand (no DDP wrapper): every rank keeps a full replica, the
window's gradient is all-reduced once before the optimizer step. The student's
input projection is frozen (copied from the teacher), so only the trainable
parameters are differentiated.

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 49015 a_b03.py
"""
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

IN_DIM, N_CLASSES = 40, 10
ACCUM = 3
MICRO_BS = 24
STEPS = 25
TEMP = 2.0
ALPHA = 0.7
LR = 0.05
CLIP = 5.0


def mlp(width, depth):
    layers, d = [], IN_DIM
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.Tanh()]
        d = width
    layers.append(nn.Linear(d, N_CLASSES))
    return nn.Sequential(*layers)


class Distiller:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(0)
        self.teacher = mlp(128, 3).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.student = mlp(32, 2)
        with torch.no_grad():
            # reuse the teacher's first projection rows and keep them fixed
            self.student[0].weight.copy_(self.teacher[0].weight[:32])
            self.student[0].bias.copy_(self.teacher[0].bias[:32])
        self.student[0].requires_grad_(False)
        self.trainable = [p for p in self.student.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(self.trainable, lr=LR, momentum=0.9, nesterov=True)
        self.gen = torch.Generator().manual_seed(1000 + rank)

    def batch(self):
        x = torch.randn(MICRO_BS, IN_DIM, generator=self.gen)
        y = torch.randint(0, N_CLASSES, (MICRO_BS,), generator=self.gen)
        return x, y

    def kd_loss(self, x, y):
        with torch.no_grad():
            t_logits = self.teacher(x)
        s_logits = self.student(x)
        kd = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.softmax(t_logits / TEMP, -1),
                      reduction="batchmean") * TEMP * TEMP
        ce = F.cross_entropy(s_logits, y)
        return ALPHA * kd + (1 - ALPHA) * ce

    def accumulate(self, loss):
        grads = torch.autograd.grad(loss / ACCUM, self.trainable)
        for p, g in zip(self.trainable, grads):
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)

    def sync_and_step(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.trainable])
        dist.all_reduce(flat)
        flat /= self.world
        off = 0
        for p in self.trainable:
            n = p.numel()
            p.grad.copy_(flat[off:off + n].view_as(p))
            off += n
        torch.nn.utils.clip_grad_norm_(self.trainable, CLIP)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        for step in range(STEPS):
            logged = 0.0
            for _ in range(ACCUM):
                x, y = self.batch()
                loss = self.kd_loss(x, y)
                self.accumulate(loss)
                logged += loss.item() / ACCUM
            self.sync_and_step()
            if self.rank == 0 and step % 5 == 0:
                print(f"step {step} loss {logged:.4f}", flush=True)

    def fingerprint(self):
        h = hashlib.sha256()
        for _, p in self.student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    dist.init_process_group(backend="gloo")
    d = Distiller(dist.get_rank(), dist.get_world_size())
    d.fit()
    fp = d.fingerprint()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {fp}")
    dist.destroy_process_group()
