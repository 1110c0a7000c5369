"""nanoGPT-style DDP loop on padded variable-length sequences. The loss of each window
is the sum of token losses over the window's non-pad tokens on all ranks; the run stops
half-way, checkpoints, and resumes into freshly built objects.
"""
import hashlib
import io
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

VOCAB, D, SEQ, BS, K = 32, 32, 12, 3, 4
MICRO_PER_EPOCH = 10          # windows 4-4-2 per epoch
EPOCHS, STOP_AFTER_EPOCH = 2, 1
LR, CLIP, PAD = 2e-3, 0.3, -100


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0])


def micro_batches(rank, epoch):
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    out = []
    for _ in range(MICRO_PER_EPOCH):
        x = torch.randint(0, VOCAB, (BS, SEQ + 1), generator=g)
        lens = torch.randint(3, SEQ + 1, (BS,), generator=g)
        y = x[:, 1:].clone()
        y[torch.arange(SEQ)[None, :] >= lens[:, None]] = PAD
        out.append((x[:, :-1], y))
    return out


def lr_at(step, total):
    return LR * 0.5 * (1 + math.cos(math.pi * step / total))


def build(world):
    torch.manual_seed(0)
    model = DDP(TinyLM())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.05)
    return model, opt


def run_epochs(model, opt, state, epochs, rank, world):
    total_steps = EPOCHS * math.ceil(MICRO_PER_EPOCH / K)
    for epoch in epochs:
        mbs = micro_batches(rank, epoch)
        for w0 in range(0, len(mbs), K):
            window = mbs[w0:w0 + K]
            n_tok = torch.tensor(float(sum((y != PAD).sum().item() for _, y in window)))
            dist.all_reduce(n_tok, op=dist.ReduceOp.SUM)
            for j, (x, y) in enumerate(window):
                model.require_backward_grad_sync = j == len(window) - 1
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1),
                                       ignore_index=PAD, reduction="sum")
                (loss * world / n_tok).backward()
            for gr in opt.param_groups:
                gr["lr"] = lr_at(state["step"], total_steps)
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            state["step"] += 1


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    model, opt = build(world)
    state = {"step": 0}
    run_epochs(model, opt, state, range(STOP_AFTER_EPOCH), rank, world)
    buf = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": state["step"]}, buf)
    del model, opt

    buf.seek(0)
    ckpt = torch.load(buf)
    model, opt = build(world)
    model.module.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    state = {"step": ckpt["step"]}
    run_epochs(model, opt, state, range(STOP_AFTER_EPOCH, EPOCHS), rank, world)

    if rank == 0:
        print(f"optimizer steps: {state['step']}")
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.module.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
