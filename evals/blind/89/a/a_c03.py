# Accelerate: an encoder and a separate head, each with its own optimizer and scheduler, accumulated together
# in one accelerator.accumulate(encoder, head) block; clipping only on sync steps; a resize of the head
# (new classes added after a warm-up phase, optimizer rebuilt and re-prepared)
import hashlib

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

K = 2
MICRO_BS = 5
PHASE_STEPS = (6, 8)  # optimizer steps in phase 1 (3 classes) and phase 2 (5 classes)


def make_loader(n_classes, n_steps, world, seed):
    n = world * MICRO_BS * K * n_steps
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    y = torch.randint(0, n_classes, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=MICRO_BS, shuffle=False)


def grow_head(head, n_new):
    old = head
    new = nn.Linear(old.in_features, old.out_features + n_new)
    with torch.no_grad():
        new.weight.zero_()
        new.bias.zero_()
        new.weight[: old.out_features] = old.weight
        new.bias[: old.out_features] = old.bias
    return new


def run_phase(accelerator, encoder, head, enc_opt, head_opt, enc_sched, head_sched, loader):
    for x, y in loader:
        with accelerator.accumulate(encoder, head):
            logits = head(encoder(x))
            loss = nn.functional.cross_entropy(logits, y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(list(encoder.parameters()) + list(head.parameters()), 0.5)
            enc_opt.step()
            head_opt.step()
            enc_sched.step()
            head_sched.step()
            enc_opt.zero_grad()
            head_opt.zero_grad()


def main():
    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    world = accelerator.num_processes
    set_seed(17)
    encoder = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
    head = nn.Linear(16, 3)

    enc_opt = torch.optim.AdamW(encoder.parameters(), lr=3e-3)
    enc_sched = torch.optim.lr_scheduler.LambdaLR(enc_opt, lambda s: 1.0 - s / (world * (sum(PHASE_STEPS) + 1)))
    head_opt = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9)
    head_sched = torch.optim.lr_scheduler.StepLR(head_opt, step_size=3 * world, gamma=0.7)
    loader = make_loader(3, PHASE_STEPS[0], world, seed=1)
    encoder, head, enc_opt, head_opt, enc_sched, head_sched, loader = accelerator.prepare(
        encoder, head, enc_opt, head_opt, enc_sched, head_sched, loader)
    run_phase(accelerator, encoder, head, enc_opt, head_opt, enc_sched, head_sched, loader)

    # phase 2: two new classes; rebuild the head optimizer for the resized head
    head = grow_head(accelerator.unwrap_model(head), 2)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    head_sched = torch.optim.lr_scheduler.StepLR(head_opt, step_size=3 * world, gamma=0.7)
    loader2 = make_loader(5, PHASE_STEPS[1], world, seed=2)
    head, head_opt, head_sched, loader2 = accelerator.prepare(head, head_opt, head_sched, loader2)
    run_phase(accelerator, encoder, head, enc_opt, head_opt, enc_sched, head_sched, loader2)

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for mod in (encoder, head):
            for _, p in accelerator.unwrap_model(mod).named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
