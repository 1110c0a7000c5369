"""Accelerate with two prepared models (a feature frontend and a predictor), two optimizers
(AdamW + SGD with momentum) and two prepared schedulers, accumulated under one
`accumulate(frontend, predictor)` driven by a GradientAccumulationPlugin. Epochs of 10
micro-batches per rank with K = 3 end in a 1-batch window; Accelerate divides every loss by K,
so each micro-batch loss is rescaled by K / (size of its window)."""
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed

SEED = 21
K = 3
MICRO = 5
BATCHES_PER_RANK = 10
EPOCHS = 2
CLIP = 0.8


class Frontend(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 8, kernel_size=5, padding=2)
        self.pool = nn.AdaptiveAvgPool1d(6)

    def forward(self, x):
        return self.pool(F.gelu(self.conv(x))).flatten(1)


class Predictor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(48, 32), nn.Tanh(), nn.Linear(32, 3))

    def forward(self, h):
        return self.net(h)


def build_data():
    g = torch.Generator().manual_seed(SEED)
    n = MICRO * BATCHES_PER_RANK * 2
    x = torch.randn(n, 2, 20, generator=g)
    y = torch.stack([x[:, 0].mean(-1), x[:, 1].std(-1), (x[:, 0] * x[:, 1]).mean(-1)], dim=1)
    return torch.utils.data.TensorDataset(x, y)


def window_size(i, n_batches):
    start = (i // K) * K
    return min(K, n_batches - start)


def main():
    plugin = GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    set_seed(SEED)
    frontend, predictor = Frontend(), Predictor()
    opt_f = torch.optim.AdamW(frontend.parameters(), lr=2e-3, weight_decay=0.01)
    opt_p = torch.optim.SGD(predictor.parameters(), lr=5e-2, momentum=0.9)
    steps = EPOCHS * math.ceil(BATCHES_PER_RANK / K)
    # a prepared scheduler is stepped num_processes times per optimizer step
    horizon = steps * accelerator.num_processes
    sch_f = torch.optim.lr_scheduler.LambdaLR(opt_f, lambda s: max(0.05, 1 - s / horizon))
    sch_p = torch.optim.lr_scheduler.LambdaLR(opt_p, lambda s: max(0.05, 1 - s / horizon))
    loader = torch.utils.data.DataLoader(build_data(), batch_size=MICRO, shuffle=True,
                                         generator=torch.Generator().manual_seed(SEED))
    frontend, predictor, opt_f, opt_p, sch_f, sch_p, loader = accelerator.prepare(
        frontend, predictor, opt_f, opt_p, sch_f, sch_p, loader)
    n_batches = len(loader)
    assert n_batches == BATCHES_PER_RANK

    for epoch in range(EPOCHS):
        for i, (x, y) in enumerate(loader):
            with accelerator.accumulate(frontend, predictor):
                pred = predictor(frontend(x))
                loss = F.mse_loss(pred, y) * K / window_size(i, n_batches)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(list(frontend.parameters()) + list(predictor.parameters()), CLIP)
                for opt, sch in ((opt_f, sch_f), (opt_p, sch_p)):
                    opt.step()
                    sch.step()
                    opt.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for m in (frontend, predictor):
            for _, p in accelerator.unwrap_model(m).named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
