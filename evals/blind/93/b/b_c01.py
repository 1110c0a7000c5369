"""ZeRO-2 fine-tune of a tiny token classifier with a frozen embedding table.

* accumulation comes from the config through train_batch_size (no explicit GA key)
* client AdamW with two groups and a client warm-up LambdaLR, both handed to the engine
* explicit gradient clipping at 0.5
* checkpoint at an optimizer-step boundary, then a fresh engine resumes from it
"""
import hashlib
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

MICRO, ACCUM, TOTAL_UPDATES, SAVE_AT = 4, 2, 10, 4
VOCAB, N_CLS, D = 50, 3, 24
SEED = 99
CKPT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c01_ckpt")


def ds_config(world):
    return {
        "train_batch_size": MICRO * ACCUM * world,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
    }


class TokenClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.emb.weight.requires_grad_(False)
        self.mix = nn.Linear(D, D)
        self.out = nn.Linear(D, N_CLS)

    def forward(self, ids):
        h = torch.tanh(self.mix(self.emb(ids).mean(1)))
        return self.out(h)


def build_engine():
    torch.manual_seed(SEED)
    model = TokenClassifier()
    groups = [
        {"params": [model.mix.weight, model.out.weight], "weight_decay": 0.05},
        {"params": [model.mix.bias, model.out.bias], "weight_decay": 0.0, "lr": 2e-3},
    ]
    opt = torch.optim.AdamW(groups, lr=4e-3)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=warm,
                                               config=ds_config(dist.get_world_size()))
    return engine


def data(rank, world):
    g = torch.Generator().manual_seed(SEED + 5)
    n = MICRO * ACCUM * world * TOTAL_UPDATES
    ids = torch.randint(0, VOCAB, (n, 10), generator=g)
    y = (ids[:, :3].sum(1) % N_CLS)
    return ids[rank::world], y[rank::world]


def run(engine, ids, y, first_micro, last_micro):
    for i in range(first_micro, last_micro):
        xb, yb = ids[i * MICRO:(i + 1) * MICRO], y[i * MICRO:(i + 1) * MICRO]
        loss = F.cross_entropy(engine(xb), yb)
        engine.backward(loss)
        engine.step()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ids, y = data(rank, world)
    engine = build_engine()
    assert engine.gradient_accumulation_steps() == ACCUM
    run(engine, ids, y, 0, SAVE_AT * ACCUM)
    if rank == 0 and os.path.isdir(CKPT_DIR):
        shutil.rmtree(CKPT_DIR)
    dist.barrier()
    engine.save_checkpoint(CKPT_DIR, tag="resume")
    dist.barrier()
    del engine

    engine = build_engine()  # fresh objects, state comes from disk
    engine.load_checkpoint(CKPT_DIR, tag="resume")
    done = engine.global_steps
    run(engine, ids, y, done * ACCUM, TOTAL_UPDATES * ACCUM)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in engine.module.named_parameters()},
                       os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
