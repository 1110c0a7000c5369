# corpus: style=trainer_class class=OK
# the same trainer with unscale_ before the clip
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
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_norm)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


if __name__ == "__main__":
    train(build_model(), build_loader(), TrainConfig())
