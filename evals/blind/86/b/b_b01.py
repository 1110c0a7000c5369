"""Token tagger trained with a DeepSpeed ZeRO-1 engine (config file, client SGD optimizer).

The engine owns gradient accumulation (config GA = K) and averages gradients over the
data-parallel ranks. The loss is a token sum normalised by the number of valid tokens of
the whole window (all micro-batches, all ranks), rescaled so that the engine's own
divisions cancel.
"""
import argparse
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import deepspeed

PAD = -100


@dataclass
class RunConfig:
    vocab: int = 64
    hidden: int = 48
    n_tags: int = 9
    seq_len: int = 12
    micro_bs: int = 4
    grad_accum: int = 4
    steps: int = 12
    lr: float = 0.05
    seed: int = 1234


class Tagger(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.hidden)
        self.rnn = nn.GRU(cfg.hidden, cfg.hidden, batch_first=True)
        self.proj = nn.Linear(cfg.hidden, cfg.n_tags)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.proj(h)


def make_shard(cfg, rank, n_micro):
    g = torch.Generator().manual_seed(cfg.seed + 17 * rank)
    out = []
    for _ in range(n_micro):
        x = torch.randint(0, cfg.vocab, (cfg.micro_bs, cfg.seq_len), generator=g)
        y = torch.randint(0, cfg.n_tags, (cfg.micro_bs, cfg.seq_len), generator=g)
        lens = torch.randint(2, cfg.seq_len + 1, (cfg.micro_bs,), generator=g)
        mask = torch.arange(cfg.seq_len)[None, :] < lens[:, None]
        y = y.masked_fill(~mask, PAD)
        out.append((x, y))
    return out


class TokenLossNormalizer:
    """Turns a token-sum loss into the window's token mean, seen through the engine."""

    def __init__(self, grad_accum, world_size):
        self.grad_accum = grad_accum
        self.world_size = world_size
        self.denom = None

    def start_window(self, window):
        n = torch.tensor(float(sum((y != PAD).sum().item() for _, y in window)))
        dist.all_reduce(n)
        self.denom = n

    def __call__(self, loss_sum):
        # the engine divides by GA and averages over ranks; undo the GA division
        return loss_sum * self.grad_accum / self.denom


def write_ds_config(cfg, world_size, path):
    conf = {
        "train_micro_batch_size_per_gpu": cfg.micro_bs,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.micro_bs * cfg.grad_accum * world_size,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 1, "overlap_comm": False, "contiguous_gradients": True},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 6,
    }
    with open(path, "w") as f:
        json.dump(conf, f, indent=2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    args, _ = p.parse_known_args()
    cfg = RunConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    model = Tagger(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    cfg_dir = tempfile.mkdtemp(prefix="dscfg_") if rank == 0 else None
    obj = [cfg_dir]
    dist.broadcast_object_list(obj, src=0)
    cfg_path = os.path.join(obj[0], "ds_config.json")
    if rank == 0:
        write_ds_config(cfg, world, cfg_path)
    dist.barrier()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg_path)

    data = make_shard(cfg, rank, cfg.steps * cfg.grad_accum)
    norm = TokenLossNormalizer(cfg.grad_accum, world)
    for step in range(cfg.steps):
        window = data[step * cfg.grad_accum:(step + 1) * cfg.grad_accum]
        norm.start_window(window)
        for x, y in window:
            logits = engine(x)
            loss_sum = F.cross_entropy(logits.reshape(-1, cfg.n_tags), y.reshape(-1),
                                       ignore_index=PAD, reduction="sum")
            engine.backward(norm(loss_sum))
            engine.step()

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in engine.module.named_parameters()])
    if rank == 0:
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
