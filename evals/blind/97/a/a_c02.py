"""Accelerate distillation on 2 ranks: a frozen teacher, a student and a projector prepared as
two models with two optimizers and two schedulers, K 3 through the Accelerator, a worker
DataLoader, a clip on updates, and a checkpoint at a window boundary resumed into fresh objects
(a new Accelerator, models, optimizers, schedulers) with `skip_first_batches`."""
import hashlib
import os
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, TensorDataset

K, MB, EPOCHS, N = 3, 4, 2, 144          # per rank: 18 micro-batches, 6 windows per epoch
STOP_AFTER_UPDATES = 7                   # checkpoint mid epoch 2 (window boundary)
CKPT = "tmp_scratch/a_c02_ckpt"
D_IN, D_T, D_S, N_CLS = 20, 64, 24, 6


def dataset():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, D_IN, generator=g)
    return TensorDataset(x, (x[:, :N_CLS] * 2).argmax(1))


def build():
    acc = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K))
    set_seed(0)
    teacher = nn.Sequential(nn.Linear(D_IN, D_T), nn.ReLU(), nn.Linear(D_T, N_CLS)).requires_grad_(False)
    student = nn.Sequential(nn.Linear(D_IN, D_S), nn.ReLU())
    proj = nn.Linear(D_S, N_CLS)
    opt_s = torch.optim.AdamW(student.parameters(), lr=3e-3, weight_decay=0.05)
    opt_p = torch.optim.SGD(proj.parameters(), lr=5e-2, momentum=0.9)
    total = EPOCHS * (N // (MB * 2)) // K                      # optimizer steps
    # prepared schedulers advance num_processes times per optimizer step
    sch_s = torch.optim.lr_scheduler.LambdaLR(opt_s, lambda s: 1 - s / (total * acc.num_processes + 1))
    sch_p = torch.optim.lr_scheduler.StepLR(opt_p, step_size=4 * acc.num_processes, gamma=0.5)
    loader = DataLoader(dataset(), batch_size=MB, shuffle=False, num_workers=1)
    student, proj, opt_s, opt_p, sch_s, sch_p, loader = acc.prepare(
        student, proj, opt_s, opt_p, sch_s, sch_p, loader)
    teacher = teacher.to(acc.device).eval()
    return acc, teacher, student, proj, (opt_s, opt_p), (sch_s, sch_p), loader


def train(state, start_epoch=0, skip=0, stop_after=None):
    acc, teacher, student, proj, opts, schs, loader = state
    updates = 0
    for epoch in range(start_epoch, EPOCHS):
        dl = acc.skip_first_batches(loader, skip) if (epoch == start_epoch and skip) else loader
        for x, y in dl:
            with acc.accumulate(student, proj):
                logits = proj(student(x))
                with torch.no_grad():
                    t = teacher(x)
                kd = F.kl_div(F.log_softmax(logits / 2.0, -1), F.softmax(t / 2.0, -1),
                              reduction="batchmean") * 4.0
                loss = 0.5 * kd + 0.5 * F.cross_entropy(logits, y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(list(student.parameters()) + list(proj.parameters()), 0.3)
                for o in opts:
                    o.step()
                for s in schs:
                    s.step()
                for o in opts:
                    o.zero_grad()
            if acc.sync_gradients:
                updates += 1
                if stop_after is not None and updates == stop_after:
                    return epoch, (updates * K) % len(loader)
    return None


def main():
    state = build()
    acc = state[0]
    if acc.is_main_process and os.path.isdir(CKPT):
        shutil.rmtree(CKPT)
    acc.wait_for_everyone()
    epoch, in_epoch = train(state, stop_after=STOP_AFTER_UPDATES)
    acc.save_state(CKPT)
    acc.wait_for_everyone()
    del state, acc
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()

    state = build()                                   # fresh objects, then the checkpoint
    acc = state[0]
    acc.load_state(CKPT)
    train(state, start_epoch=epoch, skip=in_epoch)

    acc.wait_for_everyone()
    if acc.is_main_process:
        h = hashlib.sha256()
        for m in (acc.unwrap_model(state[2]), acc.unwrap_model(state[3])):
            for _, p in m.named_parameters():
                h.update(p.detach().float().cpu().numpy().astype(np.float32).tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
