"""ZeRO-3 regression run that is interrupted after 6 updates and resumed into a brand-new
engine from a DeepSpeed checkpoint.

- gradient accumulation 3 owned by the engine, one engine.step() per micro-batch
- a frozen random-feature projection (requires_grad=False) inside the model
- warm-up/decay schedule owned by DeepSpeed (config), sized in optimizer updates
- gradient clipping 0.5 set explicitly
"""
import hashlib
import shutil
import tempfile

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn

CFG = dict(in_dim=20, feat=64, hidden=64, out=3, micro_bs=4, K=3,
           updates=12, stop_after=6, lr=3e-3, seed=5)


class RFFRegressor(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.proj = nn.Linear(c["in_dim"], c["feat"])
        self.proj.requires_grad_(False)  # random Fourier features, never trained
        self.mlp = nn.Sequential(nn.Linear(c["feat"], c["hidden"]), nn.SiLU(),
                                 nn.Linear(c["hidden"], c["hidden"]), nn.SiLU(),
                                 nn.Linear(c["hidden"], c["out"]))

    def forward(self, x, y):
        pred = self.mlp(torch.cos(self.proj(x)))
        return nn.functional.smooth_l1_loss(pred, y)


def micro_batch(c, rank, idx):
    g = torch.Generator().manual_seed(c["seed"] * 100_003 + idx * 2 + rank)
    x = torch.randn(c["micro_bs"], c["in_dim"], generator=g)
    y = torch.stack([x[:, :5].sum(1), x[:, 5:10].pow(2).mean(1), torch.sin(x[:, 10])], 1)
    return x, 3.0 * y


def build_engine(c):
    torch.manual_seed(c["seed"])
    model = RFFRegressor(c)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=c["lr"], weight_decay=0.0)
    ds_cfg = {
        "train_micro_batch_size_per_gpu": c["micro_bs"],
        "gradient_accumulation_steps": c["K"],
        "gradient_clipping": 0.5,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 3, "overlap_comm": False,
                              "stage3_param_persistence_threshold": 0},
        "scheduler": {"type": "WarmupDecayLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": c["lr"],
                                 "warmup_num_steps": 3, "total_num_steps": c["updates"],
                                 "warmup_type": "linear"}},
        "steps_per_print": 10_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_cfg)
    return engine


def run_updates(engine, c, rank, until):
    while engine.global_steps < until:
        idx = engine.global_steps * c["K"]
        for k in range(c["K"]):
            x, y = micro_batch(c, rank, idx + k)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    box = [tempfile.mkdtemp(prefix="c01_ckpt_") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_dir = box[0]

    engine = build_engine(CFG)
    run_updates(engine, CFG, rank, CFG["stop_after"])
    engine.save_checkpoint(ckpt_dir, tag="interrupted")
    del engine

    engine = build_engine(CFG)
    engine.load_checkpoint(ckpt_dir, tag="interrupted")
    run_updates(engine, CFG, rank, CFG["updates"])

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        print(f"updates={engine.global_steps} lr={engine.get_lr()[0]:.6f}")
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
