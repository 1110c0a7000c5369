"""Config-driven DeepSpeed ZeRO-3 run: GA 2 in the engine, a client AdamW with two parameter
groups (no decay on biases and norms), a frozen input projection, a config WarmupCosineLR
whose horizon is counted in optimizer steps, and a gradient clip of 0.3 that acts.
"""
import hashlib
import json

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

SETTINGS = json.loads("""
{
  "seed": 21,
  "micro_bs": 4,
  "grad_accum": 2,
  "optimizer_steps": 5,
  "lr": 0.004,
  "clip": 0.3
}
""")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 32)
        self.norm = nn.LayerNorm(32)
        self.hidden = nn.Linear(32, 32)
        self.out = nn.Linear(32, 3)

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        h = F.gelu(self.hidden(self.norm(h)))
        return self.out(h)


def build_config(s, world):
    return {
        "train_micro_batch_size_per_gpu": s["micro_bs"],
        "gradient_accumulation_steps": s["grad_accum"],
        "train_batch_size": s["micro_bs"] * s["grad_accum"] * world,
        "gradient_clipping": s["clip"],
        "zero_optimization": {"stage": 3, "overlap_comm": False, "stage3_param_persistence_threshold": 0},
        "zero_force_ds_cpu_optimizer": False,
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": s["optimizer_steps"], "warmup_num_steps": 2,
                                 "warmup_min_ratio": 0.1, "cos_min_ratio": 0.1}},
        "steps_per_print": 10_000,
    }


def main():
    s = SETTINGS
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(s["seed"])
    model = Net()
    model.proj.requires_grad_(False)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight") and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not (n.endswith("weight") and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=s["lr"])
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, config=build_config(s, world))

    g = torch.Generator().manual_seed(s["seed"] + 1 + rank)
    W = torch.randn(12, 3, generator=torch.Generator().manual_seed(s["seed"] + 99))
    for micro in range(s["optimizer_steps"] * s["grad_accum"]):
        x = torch.randn(s["micro_bs"], 12, generator=g) * 3.0
        y = (x @ W).argmax(-1)
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
    if rank == 0:
        print(f"optimizer steps {engine.global_steps} lr {sched.get_last_lr()} grad norm {engine.get_global_grad_norm()}",
              flush=True)

    params = [p for _, p in engine.module.named_parameters()]
    h = hashlib.sha256()
    with deepspeed.zero.GatheredParameters(params):
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
