"""Sequence tagger on DDP with a hand-written averaging comm hook.

Unusual but intended:
- an accumulation schedule that changes with the epoch (K = 2 in epoch 0, K = 3 after);
- the loss of each window is the mean over that window's micro-batches (all the same size),
  with `no_sync()` around forward and backward of every non-final micro-batch;
- a frozen positional table;
- after epoch 0 the run checkpoints model/optimizer/scheduler, tears everything down and
  continues from the checkpoint in freshly built DDP / optimizer / scheduler objects.
"""
import hashlib
import io
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, TAGS, DIM, SEQ, MB, SEED = 50, 7, 24, 12, 6, 4242
ACCUM_SCHEDULE = {0: 2, 1: 3}   # epoch -> K
MICRO_PER_EPOCH = 12            # divisible by both K


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.1, requires_grad=False)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.cls = nn.Linear(DIM, TAGS)

    def forward(self, ids):
        h, _ = self.rnn(self.tok(ids) + self.pos)
        return self.cls(h)


def mean_allreduce_hook(state, bucket):
    world = dist.get_world_size(state)
    buf = bucket.buffer()
    grad32 = buf.to(torch.float32).div_(world)
    fut = dist.all_reduce(grad32, group=state, async_op=True).get_future()

    def finish(f):
        buf.copy_(f.value()[0])
        return buf

    return fut.then(finish)


def build(state_blob=None):
    torch.manual_seed(SEED)
    net = Tagger()
    model = DDP(net)
    model.register_comm_hook(dist.group.WORLD, mean_allreduce_hook)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                            lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    if state_blob is not None:
        st = torch.load(io.BytesIO(state_blob), weights_only=True)
        model.module.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
    return model, opt, sched


def epoch_batches(epoch, rank):
    g = torch.Generator().manual_seed(SEED + 10 * epoch + rank)
    for _ in range(MICRO_PER_EPOCH):
        ids = torch.randint(0, VOCAB, (MB, SEQ), generator=g)
        tags = (ids * 3 + torch.roll(ids, 1, dims=1)) % TAGS
        yield ids, tags


def run_epoch(model, opt, sched, epoch, rank):
    k = ACCUM_SCHEDULE[epoch]
    for i, (ids, tags) in enumerate(epoch_batches(epoch, rank)):
        last = (i + 1) % k == 0
        with (nullcontext() if last else model.no_sync()):
            logits = model(ids)
            loss = F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1)) / k
            loss.backward()
        if last:
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt, sched = build()
    run_epoch(model, opt, sched, 0, rank)
    buf = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, buf)
    blob = buf.getvalue()
    del model, opt, sched

    model, opt, sched = build(blob)
    run_epoch(model, opt, sched, 1, rank)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
