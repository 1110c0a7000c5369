"""Tabular regression with a DeepSpeed ZeRO-2 engine, config written to a JSON file.

- the engine owns gradient accumulation (GA 4) and the LR schedule (WarmupDecayLR sized in
  optimizer steps) around a client AdamW, gradient clipping set explicitly in the config;
- a frozen random-feature projection, two parameter groups (no decay on biases/norms);
- halfway through, the run saves an engine checkpoint at a step boundary, throws the engine
  away and continues in a freshly built engine loaded from that checkpoint.
"""
import hashlib
import json
import os
import tempfile

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn

MICRO, GA, STEPS, SPLIT_AT, SEED = 6, 4, 12, 6, 2024


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Linear(16, 64)   # frozen random features
        self.features.requires_grad_(False)
        self.norm = nn.LayerNorm(64)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x):
        h = torch.cos(self.features(x))
        return self.fc2(torch.relu(self.fc1(self.norm(h)))).squeeze(-1)


def write_config(path, world):
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GA,
        "train_batch_size": MICRO * GA * world,
        "gradient_clipping": 0.5,
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 4e-3,
                                 "warmup_num_steps": 3, "total_num_steps": STEPS,
                                 "warmup_type": "linear"}},
        "zero_optimization": {"stage": 2, "contiguous_gradients": True,
                              "overlap_comm": False, "reduce_bucket_size": 4096},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 100000,
    }
    with open(path, "w") as f:
        json.dump(cfg, f)


def param_groups(model):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim == 1 else decay).append(p)
    return [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]


def build_engine(config_path):
    torch.manual_seed(SEED)
    model = Net()
    opt = torch.optim.AdamW(param_groups(model), lr=4e-3, betas=(0.9, 0.98), eps=1e-8)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config_path)
    return engine


def data(rank, world):
    g = torch.Generator().manual_seed(SEED + 1)
    n = MICRO * GA * world * STEPS
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(1) - x[:, 4:8].prod(1)).tanh()
    x, y = x[rank::world], y[rank::world]
    return list(zip(x.split(MICRO), y.split(MICRO)))


def run_micro(engine, batch):
    x, y = batch
    loss = nn.functional.smooth_l1_loss(engine(x), y, beta=0.5)
    engine.backward(loss)
    engine.step()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    workdir = "/tmp/b_c01_ckpt"
    cfg_path = os.path.join(workdir, "ds_config.json")
    if rank == 0:
        os.makedirs(workdir, exist_ok=True)
        write_config(cfg_path, world)
    dist.barrier()

    batches = data(rank, world)
    engine = build_engine(cfg_path)
    cut = SPLIT_AT * GA
    for b in batches[:cut]:
        run_micro(engine, b)
    assert engine.is_gradient_accumulation_boundary() or engine.global_steps == SPLIT_AT
    engine.save_checkpoint(workdir, tag="mid")
    dist.barrier()
    del engine

    engine = build_engine(cfg_path)
    engine.load_checkpoint(workdir, tag="mid")
    assert engine.global_steps == SPLIT_AT
    for b in batches[cut:]:
        run_micro(engine, b)
    assert engine.global_steps == STEPS

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
