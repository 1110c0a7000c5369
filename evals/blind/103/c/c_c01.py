"""RLOO-style policy-gradient fine-tuning of a tiny causal policy on 2 DDP ranks.

- rollouts are precomputed per rank (synthetic completions of different lengths)
- the loss is a sum over completion tokens, normalised by the whole window's
  completion-token count on all ranks (times W, because DDP averages)
- epochs of 10 micro-batches with K = 4: windows of 4, 4 and 2 micro-batches
- preempted after 5 optimizer steps: state saved, everything rebuilt and resumed
- linear warm-up via LambdaLR, EMA of the policy kept for evaluation
"""
import copy
import hashlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, D, T, B = 40, 32, 12, 6
K = 4
MICRO_PER_EPOCH = 10
EPOCHS = 3
PREEMPT_AFTER = 5
LR = 2e-3
EMA_DECAY = 0.9
SEED = 5


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.head(h)


def make_rollouts(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + 17 * rank + SEED)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        ids = torch.randint(0, VOCAB, (B, T), generator=g)
        prompt_len = torch.randint(2, 5, (B,), generator=g)
        comp_len = torch.randint(1, T - 5, (B,), generator=g)
        pos = torch.arange(T).unsqueeze(0)
        mask = ((pos >= prompt_len.unsqueeze(1)) & (pos < (prompt_len + comp_len).unsqueeze(1))).float()
        reward = (ids.float() * mask).sum(1) / mask.sum(1).clamp(min=1) / VOCAB
        # leave-one-out baseline inside the micro-batch
        baseline = (reward.sum() - reward) / (B - 1)
        out.append((ids, mask, reward - baseline))
    return out


def windows(seq, k):
    return [seq[i:i + k] for i in range(0, len(seq), k)]


def build(rank):
    torch.manual_seed(SEED)
    policy = Policy()
    ema = copy.deepcopy(policy).requires_grad_(False)
    model = DDP(policy)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return model, ema, opt, sched


def pg_loss(model, ids, mask, adv):
    logits = model(ids[:, :-1])
    logp = torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    m = mask[:, 1:]
    return -(logp * adv.unsqueeze(1) * m).sum(), m.sum()


def train(rank, world, model, ema, opt, sched, start_epoch, start_window, stop_after=None):
    steps = 0
    for epoch in range(start_epoch, EPOCHS):
        wins = windows(make_rollouts(rank, epoch), K)
        for wi, win in enumerate(wins):
            if epoch == start_epoch and wi < start_window:
                continue
            count = torch.tensor(sum(mb[1][:, 1:].sum() for mb in win).item())
            dist.all_reduce(count)
            for j, (ids, mask, adv) in enumerate(win):
                last = j == len(win) - 1
                ctx = model.no_sync() if not last else torch.enable_grad()
                with ctx:
                    loss_sum, _ = pg_loss(model, ids, mask, adv)
                    (loss_sum * world / count).backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for pe, pm in zip(ema.parameters(), model.module.parameters()):
                    pe.lerp_(pm, 1 - EMA_DECAY)
            steps += 1
            if stop_after is not None and steps == stop_after:
                return epoch, wi + 1
    return EPOCHS, 0


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    model, ema, opt, sched = build(rank)
    epoch, win = train(rank, world, model, ema, opt, sched, 0, 0, stop_after=PREEMPT_AFTER)
    ckdir = tempfile.mkdtemp(prefix="c_c01_") if rank == 0 else None
    box = [ckdir]
    dist.broadcast_object_list(box, src=0)
    path = os.path.join(box[0], "ckpt.pt")
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "epoch": epoch, "window": win}, path)
    dist.barrier()
    del model, ema, opt, sched

    model, ema, opt, sched = build(rank)
    state = torch.load(path, weights_only=False)
    model.module.load_state_dict(state["model"])
    ema.load_state_dict(state["ema"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    if rank == 0:
        print(f"resumed at epoch {state['epoch']} window {state['window']} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    train(rank, world, model, ema, opt, sched, state["epoch"], state["window"])

    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(path)
        os.rmdir(box[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
