# corpus: style=hand_loop class=OK
# the option is named as the config's field: dataclasses.replace takes it
import argparse
import dataclasses


@dataclasses.dataclass
class Config:
    lr: float = 1e-3
    accum_steps: int = 1


p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--accum-steps", type=int, default=8)
args = p.parse_args()
names = {f.name for f in dataclasses.fields(Config)}
cfg = dataclasses.replace(Config(), **{k: v for k, v in vars(args).items() if k in names})
for step in range(steps):
    for micro in range(cfg.accum_steps):
        (model(x[step, micro]).mean() / cfg.accum_steps).backward()
    opt.step()
    opt.zero_grad()
