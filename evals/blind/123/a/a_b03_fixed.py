#!/usr/bin/env python
# Port of a single-GPU regression script to DeepSpeed (ZeRO stage 1).
# Accumulation and clipping are delegated to the engine via the config.
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import deepspeed


def get_args():
    p = argparse.ArgumentParser(description="tabular regressor, deepspeed port")
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--batch_size", type=int, default=8, help="per-device micro batch")
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--max_grad_norm", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--n_train", type=int, default=512)
    p.add_argument("--features", type=int, default=24)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def build_model(n_in):
    return nn.Sequential(
        nn.Linear(n_in, 64), nn.SiLU(),
        nn.Linear(64, 64), nn.SiLU(),
        nn.Linear(64, 1),
    )


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(args.seed)

    g = torch.Generator().manual_seed(args.seed)
    X = torch.randn(args.n_train, args.features, generator=g)
    w = torch.randn(args.features, 1, generator=g)
    Y = torch.tanh(X @ w) + 0.1 * torch.randn(args.n_train, 1, generator=g)
    ds = TensorDataset(X, Y)
    sampler = DistributedSampler(ds, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = build_model(args.features)
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "gradient_clipping": args.max_grad_norm,
        "optimizer": {"type": "Adam", "params": {"lr": args.lr, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "steps_per_print": 10 ** 9,
    }
    model_engine, optimizer, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), config=ds_config)
    loss_fn = nn.MSELoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model_engine.train()
        running = 0.0
        for it, (xb, yb) in enumerate(loader):
            pred = model_engine(xb)
            loss = loss_fn(pred, yb)
            model_engine.backward(loss)
            model_engine.step()
            running += loss.item()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: mean loss {running / len(loader):.5f} "
                  f"global_steps {model_engine.global_steps}", flush=True)

    h = hashlib.sha256()
    for _, p in model_engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
