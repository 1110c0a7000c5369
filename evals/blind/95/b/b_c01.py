"""ZeRO-1 engine: client AdamW with two groups, a frozen input projection, a client warm-up scheduler
handed to the engine, an explicit clip, and a checkpoint reload into a fresh engine at step 4."""
import argparse, hashlib, os, tempfile
import torch, torch.nn as nn
import torch.distributed as dist
import deepspeed

CONFIG = {
    "train_micro_batch_size_per_gpu": 6,
    "gradient_accumulation_steps": 3,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 1},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
}
TOTAL_STEPS, SAVE_AT = 8, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(10, 32)
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.body(self.proj(x)))


def make_engine():
    torch.manual_seed(0)
    net = Net()
    net.proj.requires_grad_(False)
    decay = [p for n, p in net.named_parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for n, p in net.named_parameters() if p.requires_grad and p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=5e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=opt, lr_scheduler=sched, config=CONFIG)
    return engine


def data(world):
    g = torch.Generator().manual_seed(11)
    K, mb = CONFIG["gradient_accumulation_steps"], CONFIG["train_micro_batch_size_per_gpu"]
    x = torch.randn(TOTAL_STEPS * K, world, mb, 10, generator=g)
    y = torch.randn(TOTAL_STEPS * K, world, mb, 3, generator=g) + x[..., :3] * 2
    return x, y


def run(engine, x, y, rank, start_micro, stop_step):
    i = start_micro
    while engine.global_steps < stop_step:
        loss = nn.functional.smooth_l1_loss(engine(x[i, rank]), y[i, rank])
        engine.backward(loss)
        engine.step()
        i += 1
    return i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    obj = [tempfile.mkdtemp(prefix="b_c01_") if rank == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    x, y = data(world)

    engine = make_engine()
    run(engine, x, y, rank, 0, SAVE_AT)
    engine.save_checkpoint(obj[0], tag="s4", client_state={"micro": engine.global_steps * CONFIG["gradient_accumulation_steps"]})
    del engine

    engine = make_engine()
    _, client = engine.load_checkpoint(obj[0], tag="s4")
    run(engine, x, y, rank, client["micro"], TOTAL_STEPS)

    if rank == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
