"""ZeRO-3 fine-tuning of a small tagger with a frozen embedding table, two AdamW
groups (no decay on norms/biases), a client warm-up handed to the engine, a clip
of 0.3, and a mid-run checkpoint reloaded into a freshly built engine.
"""
import hashlib
import json
import os
import shutil

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT_DIR = os.path.join(HERE, "tmp_scratch", "c01_ckpt")
CFG_PATH = os.path.join(HERE, "tmp_scratch", "c01_ds_config.json")

SETTINGS = dict(vocab=50, dim=32, seq=10, tags=6, micro=4, accum=3, steps=8, save_at=4,
                lr=4e-3, warmup=3, seed=11)

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": SETTINGS["micro"],
    "gradient_accumulation_steps": SETTINGS["accum"],
    "gradient_clipping": 0.3,
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "overlap_comm": False,
        "contiguous_gradients": False,
    },
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 100000,
    "wall_clock_breakdown": False,
}


class Tagger(nn.Module):
    def __init__(self, vocab, dim, tags):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.emb.weight.requires_grad_(False)
        self.mix = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, tags)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + torch.tanh(self.mix(h))
        return self.out(self.norm(h))


def build(cfg_path):
    s = SETTINGS
    torch.manual_seed(s["seed"])
    model = Tagger(s["vocab"], s["dim"], s["tags"])
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=s["lr"])
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / s["warmup"]))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=warm,
                                           config=cfg_path)
    return engine


def micro_batches(rank, skip):
    s = SETTINGS
    g = torch.Generator().manual_seed(s["seed"] * 31 + rank)
    i = 0
    while True:
        ids = torch.randint(0, s["vocab"], (s["micro"], s["seq"]), generator=g)
        tags = (ids * 7 + torch.roll(ids, 1, dims=1)) % s["tags"]
        if i >= skip:
            yield ids, tags
        i += 1


def run(engine, first_step, last_step):
    rank = dist.get_rank()
    accum = engine.gradient_accumulation_steps()
    data = micro_batches(rank, skip=first_step * accum)
    for _ in range(first_step, last_step):
        for _ in range(accum):
            ids, tags = next(data)
            logits = engine(ids)
            loss = F.cross_entropy(logits.reshape(-1, SETTINGS["tags"]), tags.reshape(-1))
            engine.backward(loss)
            engine.step()


def gathered_sha(engine):
    params = [p for _, p in engine.module.named_parameters()]
    h = hashlib.sha256()
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        if dist.get_rank() == 0:
            for p in params:
                h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(CFG_PATH), exist_ok=True)
        shutil.rmtree(CKPT_DIR, ignore_errors=True)
        with open(CFG_PATH, "w") as f:
            json.dump(DS_CONFIG, f)
    dist.barrier()

    engine = build(CFG_PATH)
    run(engine, 0, SETTINGS["save_at"])
    engine.save_checkpoint(CKPT_DIR, tag="mid")
    dist.barrier()
    del engine

    # "restart": fresh model, optimizer, scheduler and engine, state from disk
    engine = build(CFG_PATH)
    engine.load_checkpoint(CKPT_DIR, tag="mid")
    run(engine, engine.global_steps, SETTINGS["steps"])

    sha = gathered_sha(engine)
    if dist.get_rank() == 0:
        print("FINAL_SHA256", sha, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
