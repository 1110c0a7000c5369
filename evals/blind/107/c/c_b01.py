"""Regression fine-tune on a DeepSpeed ZeRO-1 engine. The DeepSpeed settings come from the
same accelerate `DeepSpeedPlugin` our `accelerate launch` jobs use on GPU nodes, so the two
paths cannot drift; here we hand its config straight to deepspeed.initialize.

deepspeed --num_gpus 2 c_b01.py
"""
import hashlib
from dataclasses import dataclass

import deepspeed
import torch
import torch.nn as nn
from accelerate.utils import DeepSpeedPlugin
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


@dataclass
class RunConfig:
    seed: int = 1234
    grad_accum: int = 2
    micro_batch: int = 4
    n_samples: int = 160
    epochs: int = 1
    lr: float = 0.02
    momentum: float = 0.9
    zero_stage: int = 1
    # plain SGD baseline: no gradient clipping (0.0 = off)
    max_grad_norm: float = 0.0


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.n_samples, 16, generator=g)
    w = torch.randn(16, 1, generator=g) * 3.0
    y = x @ w + 5.0 + 0.1 * torch.randn(cfg.n_samples, 1, generator=g)
    return TensorDataset(x, y)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.body(x))


def deepspeed_config(cfg, world_size):
    plugin = DeepSpeedPlugin(
        zero_stage=cfg.zero_stage,
        gradient_accumulation_steps=cfg.grad_accum,
        gradient_clipping=cfg.max_grad_norm,
    )
    # resolve the "auto" batch entries the way Accelerator.prepare would
    plugin.deepspeed_config_process(
        must_match=False,
        train_micro_batch_size_per_gpu=cfg.micro_batch,
        train_batch_size=cfg.micro_batch * cfg.grad_accum * world_size,
    )
    ds_config = dict(plugin.deepspeed_config)
    ds_config["zero_allow_untested_optimizer"] = True
    ds_config["steps_per_print"] = 10**9
    return ds_config


def sha256_params(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(cfg.seed)

    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=deepspeed_config(cfg, world))

    dataset = make_data(cfg)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=cfg.micro_batch, sampler=sampler)

    loss_fn = nn.MSELoss()
    engine.train()
    for epoch in range(cfg.epochs):
        for x, y in loader:
            loss = loss_fn(engine(x), y)
            engine.backward(loss)
            engine.step()
        if rank == 0:
            print(f"epoch {epoch} steps {engine.global_steps} last loss {loss.item():.4f}", flush=True)

    digest = sha256_params(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
