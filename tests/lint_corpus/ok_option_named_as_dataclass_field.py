# corpus: style=plain class=OK
# the option is named as the field: the filter keeps it
import argparse
import dataclasses

import torch


@dataclasses.dataclass
class TrainCfg:
    lr: float = 1e-3
    grad_accum_steps: int = 1


def cli():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--grad-accum-steps", type=int, default=8)
    ns = ap.parse_args()
    known = set(TrainCfg.__dataclass_fields__)
    return TrainCfg(**{k: v for k, v in ns.__dict__.items() if k in known})


def train(model, loader):
    cfg = cli()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for i, (x, y) in enumerate(loader):
        (torch.nn.functional.mse_loss(model(x), y) / cfg.grad_accum_steps).backward()
        if (i + 1) % cfg.grad_accum_steps == 0:
            opt.step()
            opt.zero_grad()
