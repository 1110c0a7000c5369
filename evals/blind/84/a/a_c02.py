"""Accelerate + PEFT LoRA on 2 CPU processes: two optimizers (adapters / head),
two prepared schedulers, a prepared DataLoader with a worker process, two epochs.

Prepared schedulers advance num_processes times per optimizer update, so their
horizons are written in "process-steps" (updates x num_processes).
"""
import hashlib, math, os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model

ACCUM, MICRO_BS, EPOCHS, WORLD_HINT = 3, 4, 2, 2
N_SAMPLES = 96   # 12 micro-batches per process per epoch -> 4 updates per epoch


class Tower(nn.Module):
    def __init__(self, d=20, h=40, c=6):
        super().__init__()
        self.proj = nn.Linear(d, h)
        self.hidden = nn.Linear(h, h)
        self.classifier = nn.Linear(h, c)

    def forward(self, x):
        return self.classifier(F.silu(self.hidden(F.silu(self.proj(x)))))


def dataset():
    g = torch.Generator().manual_seed(99)
    x = torch.randn(N_SAMPLES, 20, generator=g)
    y = (x[:, :6].argmax(1) + (x[:, 6] > 0).long()) % 6
    return TensorDataset(x, y)


def warmup_cosine(total, warm):
    def f(s):
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, total - warm))))
    return f


def param_sha(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if os.environ.get("PARAM_DUMP"):
        torch.save([p.detach().float().cpu() for _, p in module.named_parameters()], os.environ["PARAM_DUMP"])
    return h.hexdigest()


def main():
    set_seed(5)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
    model = get_peft_model(Tower(), LoraConfig(r=4, lora_alpha=16, target_modules=["proj", "hidden"],
                                               modules_to_save=["classifier"]))
    adapters = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    head = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    opt_a = torch.optim.AdamW(adapters, lr=4e-3, weight_decay=0.0)
    opt_h = torch.optim.SGD(head, lr=0.05, momentum=0.9)
    loader = DataLoader(dataset(), batch_size=MICRO_BS, shuffle=False, num_workers=1)

    updates = EPOCHS * (len(loader) // acc.num_processes) // ACCUM
    sched_a = torch.optim.lr_scheduler.LambdaLR(opt_a, warmup_cosine(updates * acc.num_processes, 2 * acc.num_processes))
    sched_h = torch.optim.lr_scheduler.LambdaLR(opt_h, warmup_cosine(updates * acc.num_processes, 0))
    model, opt_a, opt_h, loader, sched_a, sched_h = acc.prepare(model, opt_a, opt_h, loader, sched_a, sched_h)

    model.train()
    for _ in range(EPOCHS):
        for x, y in loader:
            with acc.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                for o, s in ((opt_a, sched_a), (opt_h, sched_h)):
                    o.step()
                    s.step()
                    o.zero_grad()

    acc.wait_for_everyone()
    if acc.is_main_process:
        print("FINAL_SHA256", param_sha(acc.unwrap_model(model)))


if __name__ == "__main__":
    main()
