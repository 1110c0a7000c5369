"""Ragged-sequence LM on DeepSpeed ZeRO-2 with an engine checkpoint and a resume
into a freshly built engine.

Loss: summed token cross-entropy over the *window's* non-pad tokens on all
ranks. DeepSpeed divides every backward by gradient_accumulation_steps and
averages gradients over ranks, so each micro-batch's token sum is multiplied
by K * W / window_tokens before engine.backward. The window is read ahead so
its token count is known before the first backward. The token embedding is
frozen (pretrained lookup), everything else trains.
"""
import argparse
import hashlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import deepspeed

K = 3
MICRO = 4
VOCAB = 80
MAXLEN = 14
DIM = 40
STEPS_BEFORE_SAVE = 4
TOTAL_STEPS = 9
SEED = 99


class CausalConvLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.conv = nn.Conv1d(DIM, DIM, kernel_size=3)
        self.ff = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.Tanh(), nn.Linear(2 * DIM, DIM))
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.tok(ids).transpose(1, 2)
        x = F.pad(x, (2, 0))
        h = torch.relu(self.conv(x)).transpose(1, 2)
        h = h + self.ff(h)
        return self.out(h)


def micro_batch(step, micro, rank):
    g = torch.Generator().manual_seed(SEED * 7919 + step * 101 + micro * 13 + rank * 3)
    lens = torch.randint(3, MAXLEN + 1, (MICRO,), generator=g)
    ids = torch.randint(1, VOCAB, (MICRO, MAXLEN), generator=g)
    ids[:, 1::2] = (ids[:, 0::2][:, : ids[:, 1::2].size(1)] * 3 + 1) % VOCAB
    pos = torch.arange(MAXLEN)[None]
    ids = ids.masked_fill(pos >= lens[:, None], 0)
    labels = torch.cat([ids[:, 1:], torch.zeros(MICRO, 1, dtype=torch.long)], dim=1)
    labels = labels.masked_fill(pos + 1 >= lens[:, None], -100)
    return ids, labels


def ds_config():
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": K,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 100000, "allgather_bucket_size": 100000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def build_engine():
    torch.manual_seed(SEED)
    model = CausalConvLM()
    model.tok.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=4e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3) * (1.0 - 0.05 * s))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=ds_config())
    return engine


def train_windows(engine, first_step, last_step):
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(first_step, last_step):
        window = [micro_batch(step, m, rank) for m in range(K)]
        n_tok = torch.tensor(float(sum(int((lab != -100).sum()) for _, lab in window)))
        dist.all_reduce(n_tok)
        for ids, labels in window:
            logits = engine(ids)
            tok_sum = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")
            engine.backward(tok_sum * (K * world) / n_tok)
            engine.step()
        assert engine.global_steps == step + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=-1)
    ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.use_deterministic_algorithms(True)
    rank = dist.get_rank()

    box = [tempfile.mkdtemp(prefix="b_c01_") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_dir = box[0]

    engine = build_engine()
    train_windows(engine, 0, STEPS_BEFORE_SAVE)
    engine.save_checkpoint(ckpt_dir, tag="window_boundary")
    dist.barrier()
    del engine

    engine = build_engine()
    engine.load_checkpoint(ckpt_dir, tag="window_boundary")
    train_windows(engine, engine.global_steps, TOTAL_STEPS)

    h = hashlib.sha256()
    for _, p in engine.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
