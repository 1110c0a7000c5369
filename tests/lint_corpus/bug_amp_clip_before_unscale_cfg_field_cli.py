# corpus: style=trainer_class class=F8
# the same clip before unscale_, but use_amp is set from the command line: whether the scaler
# is on is not decided in the file (a warning)
import argparse
from dataclasses import dataclass

import torch


@dataclass
class TrainConfig:
    accum_steps: int = 4
    use_amp: bool = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--amp", action="store_true")
    args = p.parse_args()
    cfg = TrainConfig()
    cfg.use_amp = args.amp
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler(enabled=cfg.use_amp)
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y) / cfg.accum_steps
        scaler.scale(loss).backward()
        if (i + 1) % cfg.accum_steps == 0:
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)  # expect: AG135
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


main()
