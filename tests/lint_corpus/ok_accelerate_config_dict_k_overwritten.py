# corpus: style=accelerate class=OK
import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator

CFG = {"batch_size": 8, "grad_accum": 4, "lr": 3e-3}


def main(model, loader):
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=1)
    CFG["grad_accum"] = ap.parse_args().grad_accum  # the run decides: 1 steps every batch
    accelerator = Accelerator(gradient_accumulation_steps=CFG["grad_accum"], cpu=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=CFG["lr"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
