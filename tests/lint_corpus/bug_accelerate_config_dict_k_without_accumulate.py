# corpus: style=accelerate class=F1
import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator

CFG = {"batch_size": 8, "grad_accum": 4, "seed": 0, "lr": 3e-3}


def main(model, loader):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=CFG["seed"])
    CFG["seed"] = ap.parse_args().seed  # another entry written: grad_accum is still 4
    accelerator = Accelerator(gradient_accumulation_steps=CFG["grad_accum"], cpu=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=CFG["lr"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()  # expect: AG128
        optimizer.zero_grad()
