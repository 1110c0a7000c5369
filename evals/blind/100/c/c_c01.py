"""GRPO-style policy update over completions of uneven length, DDP on 2 ranks (torchrun).

The loss of a window is sum over all completion tokens of all ranks' micro-batches, divided
by that window's all-ranks token count (times W, since DDP averages). An epoch has 10
micro-batches per rank, K = 4, so windows are 4, 4, 2. The run stops after epoch 1, saves a
checkpoint and continues from it into freshly built objects.
"""
import contextlib
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, DIM, PROMPT, MAXNEW = 40, 32, 6, 10
MICRO, ACCUM, N_MICRO, EPOCHS = 4, 4, 10, 3
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c01_ckpt.pt")


class TinyPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.head(h)


def make_epoch(rank, epoch):
    """Deterministic groups of completions with group-normalised rewards and masks."""
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    batches = []
    for _ in range(N_MICRO):
        ids = torch.randint(0, VOCAB, (MICRO, PROMPT + MAXNEW), generator=g)
        lens = torch.randint(1, MAXNEW + 1, (MICRO,), generator=g)
        pos = torch.arange(PROMPT + MAXNEW)[None]
        mask = ((pos >= PROMPT) & (pos < PROMPT + lens[:, None])).float()
        reward = torch.randn(MICRO, generator=g)
        adv = (reward - reward.mean()) / (reward.std() + 1e-4)
        old_logp = -torch.rand(MICRO, PROMPT + MAXNEW, generator=g) * 3
        batches.append(dict(ids=ids, mask=mask, adv=adv, old_logp=old_logp))
    return batches


def token_loss_sum(model, b):
    logits = model(b["ids"][:, :-1])
    logp = torch.gather(F.log_softmax(logits, -1), 2, b["ids"][:, 1:, None]).squeeze(-1)
    mask = b["mask"][:, 1:]
    ratio = (logp - b["old_logp"][:, 1:]).exp()
    adv = b["adv"][:, None]
    pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    return (pg * mask).sum()


def build(world):
    torch.manual_seed(0)
    raw = TinyPolicy()
    model = DDP(raw)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    return raw, model, opt, sched


def run_epoch(epoch, rank, world, model, opt, sched):
    batches = make_epoch(rank, epoch)
    for start in range(0, N_MICRO, ACCUM):
        window = batches[start:start + ACCUM]
        count = torch.stack([b["mask"][:, 1:].sum() for b in window]).sum()
        dist.all_reduce(count)
        for i, b in enumerate(window):
            last = i == len(window) - 1
            with (contextlib.nullcontext() if last else model.no_sync()):
                loss = token_loss_sum(model, b) * world / count
                loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()

    raw, model, opt, sched = build(world)
    run_epoch(0, rank, world, model, opt, sched)
    if rank == 0:
        os.makedirs(os.path.dirname(CKPT), exist_ok=True)
        torch.save({"model": raw.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "epoch": 1}, CKPT)
    dist.barrier()
    del raw, model, opt, sched

    raw, model, opt, sched = build(world)
    state = torch.load(CKPT, weights_only=True)
    raw.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    for epoch in range(state["epoch"], EPOCHS):
        run_epoch(epoch, rank, world, model, opt, sched)

    if rank == 0:
        h = hashlib.sha256()
        for _, p in raw.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
