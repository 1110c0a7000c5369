"""Feature + logit distillation with Accelerate.

A frozen teacher, a smaller student and a projector that maps student features to the
teacher's width; student and projector are prepared separately and share one optimizer.
The OneCycle schedule is prepared too, so its horizon counts one tick per process.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, TensorDataset

IN, T_W, S_W, N_CLS = 24, 48, 16, 6
ACC_STEPS, EPOCHS, BATCH, N = 3, 2, 4, 96
TEMP, ALPHA = 2.0, 0.5


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.feat = nn.Sequential(nn.Linear(IN, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.cls = nn.Linear(width, N_CLS)

    def forward(self, x):
        f = self.feat(x)
        return f, self.cls(f)


def data():
    g = torch.Generator().manual_seed(17)
    x = torch.randn(N, IN, generator=g)
    return TensorDataset(x)


def main():
    plugin = GradientAccumulationPlugin(num_steps=ACC_STEPS, sync_with_dataloader=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert accelerator.num_processes == 2
    set_seed(8)

    teacher = Net(T_W).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = Net(S_W)
    projector = nn.Linear(S_W, T_W)

    loader = DataLoader(data(), batch_size=BATCH, shuffle=False)
    params = list(student.parameters()) + list(projector.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    updates = EPOCHS * (N // (BATCH * accelerator.num_processes)) // ACC_STEPS
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=5e-3, total_steps=updates * accelerator.num_processes, pct_start=0.3)

    student, projector, optimizer, loader, scheduler = accelerator.prepare(
        student, projector, optimizer, loader, scheduler)

    for epoch in range(EPOCHS):
        for (x,) in loader:
            with accelerator.accumulate(student, projector):
                with torch.no_grad():
                    t_feat, t_logits = teacher(x)
                s_feat, s_logits = student(x)
                kd = F.kl_div(F.log_softmax(s_logits / TEMP, -1), F.softmax(t_logits / TEMP, -1),
                              reduction="batchmean") * TEMP ** 2
                feat = F.mse_loss(projector(s_feat), t_feat)
                loss = ALPHA * kd + (1 - ALPHA) * feat
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(params, 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(student).named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        for _, p in accelerator.unwrap_model(projector).named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
