"""Accelerate + PEFT LoRA regression fine-tune, hand-rolled accumulation windows.

Each optimizer update consumes WINDOW micro-batches that we pull from the loader
ourselves (so the collator can pad a whole window at once in the real job).
"""
import argparse, hashlib, os

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--window", type=int, default=4)         # micro-batches per update
    p.add_argument("--micro_bs", type=int, default=8)
    p.add_argument("--updates", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class Regressor(nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.inp = nn.Linear(d, h)
        self.mid = nn.Linear(h, h)
        self.head = nn.Linear(h, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.mid(torch.tanh(self.inp(x))))).squeeze(-1)


def make_windows(rank, n_updates, window, bs, d=16):
    g = torch.Generator().manual_seed(1000 + rank)
    w_true = torch.randn(d, generator=g)
    out = []
    for _ in range(n_updates):
        win = []
        for _ in range(window):
            x = torch.randn(bs, d, generator=g)
            y = torch.sin(x @ w_true) + 0.1 * torch.randn(bs, generator=g)
            win.append((x, y))
        out.append(win)
    return out


def main():
    args = parse()
    set_seed(args.seed)
    accelerator = Accelerator(cpu=True)  # the window loop below does the accumulation
    base = Regressor()
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["inp", "mid"], modules_to_save=["head"])
    model = get_peft_model(base, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    model, opt = accelerator.prepare(model, opt)

    windows = make_windows(accelerator.process_index, args.updates, args.window, args.micro_bs)
    model.train()
    for win in windows:
        with accelerator.accumulate(model):
            for x, y in win:
                pred = model(x)
                loss = F.mse_loss(pred, y) / args.window
                accelerator.backward(loss)
            opt.step()
            opt.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        m = accelerator.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        if os.environ.get("PARAM_DUMP"):
            torch.save([p.detach().float().cpu() for _, p in m.named_parameters()], os.environ["PARAM_DUMP"])
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
