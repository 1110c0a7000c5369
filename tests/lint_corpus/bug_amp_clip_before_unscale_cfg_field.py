# corpus: style=trainer_class class=F8
# GradScaler(enabled=cfg.use_amp), use_amp a dataclass field defaulting to True that nothing
# in the file assigns: the scaler is on, and the clip sees the gradient times the loss scale
from dataclasses import dataclass

import torch


@dataclass
class TrainConfig:
    accum_steps: int = 4
    use_amp: bool = True
    max_norm: float = 1.0


def train(model, loader, cfg: TrainConfig):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.use_amp)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16, enabled=cfg.use_amp):
            loss = torch.nn.functional.mse_loss(model(x), y) / cfg.accum_steps
        scaler.scale(loss).backward()
        if (i + 1) % cfg.accum_steps == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_norm)  # expect: AG135
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


if __name__ == "__main__":
    train(build_model(), build_loader(), TrainConfig())
