"""Fabric: a denoising autoencoder with separate encoder/decoder optimizers, K = 3 under
`no_backward_sync`, a clip at each boundary, and an interruption after step 5 resumed into
freshly built objects from the Fabric checkpoint."""
import hashlib
import os
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset

K, MICRO_BS, TOTAL_STEPS, STOP_AT, CLIP = 3, 4, 10, 5, 0.25
HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "tmp_scratch", "a_c02_ckpt.pt")


class AE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(24, 48), nn.Tanh(), nn.Linear(48, 8))
        self.dec = nn.Sequential(nn.Linear(8, 48), nn.Tanh(), nn.Linear(48, 24))

    def forward(self, x):
        return self.dec(self.enc(x))


def build(fabric):
    torch.manual_seed(21)
    model = AE()
    opt_enc = torch.optim.AdamW(model.enc.parameters(), lr=3e-3, weight_decay=0.01)
    opt_dec = torch.optim.SGD(model.dec.parameters(), lr=0.05, momentum=0.9)
    model, opt_enc, opt_dec = fabric.setup(model, opt_enc, opt_dec)
    return model, opt_enc, opt_dec


def loader_for(fabric):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2 * K * MICRO_BS * TOTAL_STEPS, 24, generator=g)
    dl = DataLoader(TensorDataset(x), batch_size=MICRO_BS, shuffle=False)
    return fabric.setup_dataloaders(dl, use_distributed_sampler=True)


def run_steps(fabric, model, opt_enc, opt_dec, batches, start, stop):
    for step in range(start, stop):
        window = batches[step * K:(step + 1) * K]
        for i, (x,) in enumerate(window):
            is_accumulating = i < K - 1
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                noisy = x + 0.1 * torch.randn_like(x)
                loss = F.mse_loss(model(noisy), x) / K
                fabric.backward(loss)
        fabric.clip_gradients(model, opt_enc, max_norm=CLIP)
        fabric.clip_gradients(model, opt_dec, max_norm=CLIP)
        opt_enc.step()
        opt_dec.step()
        opt_enc.zero_grad()
        opt_dec.zero_grad()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    batches = list(loader_for(fabric))   # 30 micro-batches per rank, fixed order
    fabric.seed_everything(100)

    model, opt_enc, opt_dec = build(fabric)
    run_steps(fabric, model, opt_enc, opt_dec, batches, 0, STOP_AT)
    rng = torch.get_rng_state()
    fabric.save(CKPT, {"model": model, "opt_enc": opt_enc, "opt_dec": opt_dec, "step": STOP_AT})
    del model, opt_enc, opt_dec

    # "restart": fresh objects, state restored from disk
    model, opt_enc, opt_dec = build(fabric)
    state = {"model": model, "opt_enc": opt_enc, "opt_dec": opt_dec}
    rest = fabric.load(CKPT, state)
    torch.set_rng_state(rng)
    run_steps(fabric, model, opt_enc, opt_dec, batches, rest["step"], TOTAL_STEPS)

    fabric.barrier()
    if fabric.global_rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
