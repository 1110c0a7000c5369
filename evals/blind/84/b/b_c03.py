"""DDP on 2 CPU ranks: a small GRU tagger with two optimizers (SGD for the token table,
AdamW for the rest), a frozen position table, bf16 autocast, a short last window, and a
checkpoint taken at an optimizer-step boundary and restored into rebuilt DDP/optimizers.
"""
import contextlib
import hashlib
import io

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K = 4
MICRO_BS = 5
N_MICRO = 14          # per rank: windows of 4, 4, 4, 2
SAVE_AFTER_UPDATE = 2
SEED = 31


class Tagger(nn.Module):
    def __init__(self, vocab=30, d=16, n_tags=4, max_len=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.pos.weight.requires_grad_(False)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, n_tags)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        h, _ = self.rnn(self.tok(ids) + self.pos(pos)[None])
        return self.out(h)


class Run:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        torch.manual_seed(SEED)
        net = Tagger()
        self.ddp = DDP(net)
        self.opt_emb = torch.optim.SGD(net.tok.parameters(), lr=0.5, momentum=0.5)
        rest = [p for n, p in net.named_parameters() if p.requires_grad and not n.startswith("tok.")]
        self.opt_main = torch.optim.AdamW(rest, lr=5e-3)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt_main, step_size=2, gamma=0.7)
        self.updates = 0

    def optimizers(self):
        return (self.opt_emb, self.opt_main)

    def state(self):
        return {
            "model": self.ddp.module.state_dict(),
            "opt_emb": self.opt_emb.state_dict(),
            "opt_main": self.opt_main.state_dict(),
            "sched": self.sched.state_dict(),
            "updates": self.updates,
        }

    def load(self, st):
        self.ddp.module.load_state_dict(st["model"])
        self.opt_emb.load_state_dict(st["opt_emb"])
        self.opt_main.load_state_dict(st["opt_main"])
        self.sched.load_state_dict(st["sched"])
        self.updates = st["updates"]


def micro_batch(i, rank, world):
    g = torch.Generator().manual_seed(SEED * 100 + i * world + rank)
    ids = torch.randint(0, 30, (MICRO_BS, 8), generator=g)
    tags = (ids + torch.roll(ids, 1, 1)) % 4
    return ids, tags


def window_starts():
    return list(range(0, N_MICRO, K))


def train_windows(run, first_window_start, stop_after_update=None):
    for ws in window_starts():
        if ws < first_window_start:
            continue
        members = list(range(ws, min(ws + K, N_MICRO)))
        for j, i in enumerate(members):
            last = j == len(members) - 1
            with (contextlib.nullcontext() if last else run.ddp.no_sync()):
                ids, tags = micro_batch(i, run.rank, run.world)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = run.ddp(ids)
                loss = F.cross_entropy(logits.float().flatten(0, 1), tags.flatten()) / len(members)
                loss.backward()
        for o in run.optimizers():
            o.step()
        run.sched.step()
        for o in run.optimizers():
            o.zero_grad(set_to_none=True)
        run.updates += 1
        if run.rank == 0:
            print(f"update {run.updates} window {len(members)} loss {loss.item() * len(members):.4f}", flush=True)
        if stop_after_update is not None and run.updates == stop_after_update:
            return ws + K
    return N_MICRO


def sha(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    run = Run(rank, world)
    resume_at = train_windows(run, 0, stop_after_update=SAVE_AFTER_UPDATE)
    buf = io.BytesIO()
    torch.save(run.state(), buf)
    del run

    buf.seek(0)
    run = Run(rank, world)  # rebuilt from scratch, then restored
    run.load(torch.load(buf, weights_only=False))
    train_windows(run, resume_at)

    digest = sha(p for _, p in run.ddp.module.named_parameters())
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
