# corpus: style=deepspeed class=F4
import argparse

import deepspeed
import torch
from torch.utils.data import DataLoader


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=6)
    return p.parse_args()


def train(model, dataset):
    args = parse()
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # halve the rate after each epoch
    sched = torch.optim.lr_scheduler.StepLR(opt, len(loader), gamma=0.5)  # expect: AG124
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": args.accum,
              "gradient_clipping": 0.0}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=config)
    for _ in range(args.epochs):
        for x, y in loader:
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
            engine.step()
