"""Sequence-level knowledge distillation (GRU teacher -> smaller GRU student), DDP on
spawned ranks. Padded variable-length sequences; every window is normalised by the
all-ranks count of valid tokens (x world size, DDP averages). Epochs of 10 micro-batches
with K = 4 end in a 2-batch window. The run is interrupted after optimizer step 5,
checkpointed, and resumed into freshly built objects.
"""
import argparse
import hashlib
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PAD = 0


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--port", type=int, default=47207)
    p.add_argument("--vocab", type=int, default=40)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--batches-per-epoch", type=int, default=10)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.7)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--interrupt-after", type=int, default=5)
    p.add_argument("--ckpt", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c01_ckpt.pt"))
    return p.parse_args()


class LM(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb, padding_idx=PAD)
        self.rnn = nn.GRU(emb, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(torch.tanh(self.proj(h)))


def make_micro(args, epoch, idx, rank):
    g = torch.Generator().manual_seed(50_000 * epoch + 97 * idx + 7 * rank + 11)
    lens = torch.randint(4, 17, (args.micro_batch,), generator=g)
    T = int(lens.max())
    seq = torch.randint(1, args.vocab, (args.micro_batch, T + 1), generator=g)
    pos = torch.arange(T + 1)[None]
    seq = seq.masked_fill(pos > lens[:, None], PAD)
    return seq[:, :-1], seq[:, 1:]


def build(args, rank):
    torch.manual_seed(0)
    teacher = LM(args.vocab, 32, 96).requires_grad_(False).eval()
    student = LM(args.vocab, 24, 48)
    student.proj.requires_grad_(False)  # kept at its initialisation
    model = DDP(student)
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.01)
    total = args.epochs * -(-args.batches_per_epoch // args.grad_accum)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.2, total_iters=total)
    return teacher, student, model, opt, sched


def window_loss_sum(args, teacher, model, x, y):
    mask = (y != PAD)
    s_logits = model(x)
    with torch.no_grad():
        t_logits = teacher(x)
    T = args.temperature
    kl = F.kl_div(F.log_softmax(s_logits / T, -1), F.log_softmax(t_logits / T, -1), log_target=True, reduction="none").sum(-1)
    ce = F.cross_entropy(s_logits.transpose(1, 2), y, reduction="none")
    per_tok = args.alpha * (T * T) * kl + (1 - args.alpha) * ce
    return (per_tok * mask).sum()


def train(args, rank, start_epoch, start_window, step, state, stop_after):
    teacher, student, model, opt, sched = build(args, rank)
    if state is not None:
        student.load_state_dict(state["student"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
    K, W = args.grad_accum, args.world_size
    for epoch in range(start_epoch, args.epochs):
        idxs = list(range(args.batches_per_epoch))
        windows = [idxs[i:i + K] for i in range(0, len(idxs), K)]
        for w_i, window in enumerate(windows):
            if epoch == start_epoch and w_i < start_window:
                continue
            batches = [make_micro(args, epoch, j, rank) for j in window]
            n_tok = torch.tensor(float(sum(int((y != PAD).sum()) for _, y in batches)))
            dist.all_reduce(n_tok)
            for m, (x, y) in enumerate(batches):
                ctx = model.no_sync() if m < len(batches) - 1 else nullcontext()
                with ctx:
                    loss = window_loss_sum(args, teacher, model, x, y) * W / n_tok
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), args.clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if stop_after is not None and step == stop_after:
                nxt_epoch, nxt_window = (epoch, w_i + 1) if w_i + 1 < len(windows) else (epoch + 1, 0)
                if rank == 0:
                    torch.save({"student": student.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                                "epoch": nxt_epoch, "window": nxt_window, "step": step}, args.ckpt)
                dist.barrier()
                return None
    return student


def worker(rank, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.use_deterministic_algorithms(True)
    train(args, rank, 0, 0, 0, None, args.interrupt_after)
    state = torch.load(args.ckpt, map_location="cpu")
    student = train(args, rank, state["epoch"], state["window"], state["step"], state, None)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in student.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    args = get_args()
    os.makedirs(os.path.dirname(args.ckpt), exist_ok=True)
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)
