"""ZeRO-3 token tagger with a frozen embedding table, two AdamW groups, a client warm-up
schedule handed to the engine, a clip of 0.5, and a stop/restart through an engine
checkpoint into a freshly built engine.

Launch: torchrun --nproc-per-node 2 ... b_c01.py
"""
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

SEED = 31
MICRO = 4
WORLD_BATCH = 24          # = MICRO * grad-accum * world -> grad-accum 3 on 2 ranks
TOTAL_UPDATES = 9
STOP_AFTER = 5            # optimizer steps in the first "job"
VOCAB, T, D, TAGS = 40, 7, 24, 5


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.rnn_proj = nn.Linear(D, D)
        self.mix = nn.Linear(2 * D, D)
        self.head = nn.Linear(D, TAGS)

    def forward(self, tok):
        e = self.emb(tok)
        ctx = torch.cumsum(torch.tanh(self.rnn_proj(e)), dim=1) / torch.arange(1, tok.shape[1] + 1).view(1, -1, 1)
        h = F.gelu(self.mix(torch.cat([e, ctx], -1)))
        return self.head(h)


def ds_config():
    return {
        "train_batch_size": WORLD_BATCH,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 0.5,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 1_000_000,
        "zero_allow_untested_optimizer": True,
    }


def build_engine():
    torch.manual_seed(SEED)
    model = Tagger()
    model.emb.weight.requires_grad_(False)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                             {"params": no_decay, "weight_decay": 0.0}], lr=4e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=ds_config())
    return engine


def dataset(rank, world, grad_accum):
    g = torch.Generator().manual_seed(SEED + 5)
    n_micro = TOTAL_UPDATES * grad_accum
    tok = torch.randint(0, VOCAB, (n_micro, world, MICRO, T), generator=g)
    tags = (tok + torch.roll(tok, 1, dims=-1)) % TAGS
    return tok[:, rank], tags[:, rank]


def run(engine, tok, tags, start_micro, stop_update):
    engine.train()
    i = start_micro
    while engine.global_steps < stop_update:
        logits = engine(tok[i])
        loss = F.cross_entropy(logits.reshape(-1, TAGS), tags[i].reshape(-1))
        engine.backward(loss)
        engine.step()
        i += 1
    return i


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    engine = build_engine()
    K = engine.gradient_accumulation_steps()
    tok, tags = dataset(rank, world, K)
    ckpt_root = os.path.join(tempfile.gettempdir(), "b_c01_ckpt_49110")
    if rank == 0:
        shutil.rmtree(ckpt_root, ignore_errors=True)
    dist.barrier()

    run(engine, tok, tags, 0, STOP_AFTER)
    engine.save_checkpoint(ckpt_root, tag="job1")
    dist.barrier()
    del engine

    # second job: new model, new optimizer, new engine, state from disk
    engine = build_engine()
    engine.load_checkpoint(ckpt_root, tag="job1")
    resume_at = engine.global_steps * engine.gradient_accumulation_steps()
    run(engine, tok, tags, resume_at, TOTAL_UPDATES)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
        shutil.rmtree(ckpt_root, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
