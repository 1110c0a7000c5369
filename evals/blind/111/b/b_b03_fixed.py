"""Denoising autoencoder for sensor windows on a DeepSpeed ZeRO-2 engine.

argparse flags are turned into a DeepSpeed config by build_ds_config();
the client optimizer is SGD with Nesterov momentum and a StepLR that the
engine advances at every accumulation boundary. 2 ranks via the deepspeed
launcher.
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import deepspeed
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.add_argument("--features", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--latent", type=int, default=8)
    ap.add_argument("--per_device_batch", type=int, default=8)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=3)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--max_grad_norm", type=float, default=0.0, help="0 disables clipping")
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=2024)
    return ap.parse_args()


def build_ds_config(args):
    cfg = {
        "train_micro_batch_size_per_gpu": args.per_device_batch,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 50000, "allgather_bucket_size": 50000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000000,
        "gradient_clipping": args.max_grad_norm,
    }
    return cfg


class DAE(nn.Module):
    def __init__(self, f, h, z):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(f, h), nn.SiLU(), nn.Linear(h, z))
        self.dec = nn.Sequential(nn.Linear(z, h), nn.SiLU(), nn.Linear(h, f))

    def forward(self, x):
        return self.dec(self.enc(x))


def make_data(args, world):
    g = torch.Generator().manual_seed(args.seed)
    n = args.per_device_batch * args.gradient_accumulation_steps * args.updates * world
    basis = torch.randn(4, args.features, generator=g)
    coeff = torch.randn(n, 4, generator=g)
    clean = coeff @ basis + 0.5
    return TensorDataset(clean)


def reconstruction_loss(engine, clean, noise_std, gen):
    noisy = clean + noise_std * torch.randn(clean.shape, generator=gen)
    recon = engine(noisy)
    return (recon - clean).pow(2).sum(dim=1).mean()


def main():
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(args.seed)
    model = DAE(args.features, args.hidden, args.latent)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=build_ds_config(args))

    rank, world = engine.global_rank, engine.world_size
    data = make_data(args, world)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.per_device_batch, sampler=sampler, drop_last=True)
    gen = torch.Generator().manual_seed(args.seed + 17 * rank)

    engine.train()
    for (clean,) in loader:
        loss = reconstruction_loss(engine, clean, args.noise, gen)
        engine.backward(loss)
        engine.step()

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
