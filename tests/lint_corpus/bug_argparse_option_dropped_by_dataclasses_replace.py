# corpus: style=hand_loop class=F1
# the options are merged into the config with dataclasses.replace, filtered to its fields
import argparse
import dataclasses


@dataclasses.dataclass
class Config:
    lr: float = 1e-3
    accum_steps: int = 1


p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--grad-accum", type=int, default=8)  # expect: AG187
args = p.parse_args()
names = {f.name for f in dataclasses.fields(Config)}
cfg = dataclasses.replace(Config(), **{k: v for k, v in vars(args).items() if k in names})
for step in range(steps):
    for micro in range(cfg.accum_steps):
        (model(x[step, micro]).mean() / cfg.accum_steps).backward()
    opt.step()
    opt.zero_grad()
