"""FSDP2 (fully_shard) next-token model with preemption + DCP resume.

The job trains `preempt_at` updates, writes a distributed checkpoint and exits the
phase; a second phase rebuilds everything from scratch, loads the checkpoint and
finishes the run (this is how our cluster jobs look after a requeue).
"""
import argparse
import hashlib
import json
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=48)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--micro-bs", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--updates", type=int, default=16)
    p.add_argument("--preempt-at", type=int, default=7)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=2024)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 3 * dim)
        self.fc2 = nn.Linear(3 * dim, dim)

    def forward(self, h):
        return h + self.fc2(F.gelu(self.fc1(self.ln(h))))


class TinyLM(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.dim)
        self.pos = nn.Parameter(torch.zeros(a.seq, a.dim))
        self.blocks = nn.ModuleList([Block(a.dim) for _ in range(2)])
        self.ln_f = nn.LayerNorm(a.dim)
        self.lm_head = nn.Linear(a.dim, a.vocab, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            h = b(h)
        return self.lm_head(self.ln_f(h))


def build(a, mesh):
    torch.manual_seed(a.seed)
    model = TinyLM(a)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.05)
    return model, opt


def stream(a, rank, world):
    g = torch.Generator().manual_seed(a.seed + 5)
    total = a.updates * a.grad_accum * a.micro_bs * world
    base = torch.randint(0, a.vocab, (total, 1), generator=g)
    steps = torch.randint(1, 4, (total, 1), generator=g)
    seqs = (base + steps * torch.arange(a.seq + 1)) % a.vocab
    seqs = seqs[rank::world]
    return seqs.split(a.micro_bs)


def run_phase(a, mesh, ckpt_dir, resume):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = build(a, mesh)
    start, updates = 0, 0
    if resume:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ckpt_dir)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        with open(os.path.join(ckpt_dir, "trainer.json")) as f:
            meta = json.load(f)
        start, updates = meta["micro_step"], meta["updates"]

    data = stream(a, rank, world)
    K = a.grad_accum
    for i in range(start, len(data)):
        seq = data[i]
        model.set_requires_gradient_sync((i + 1) % K == 0)
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), seq[:, 1:].reshape(-1))
        (loss / K).backward()
        if (i + 1) % K == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_norm)
            opt.step()
            opt.zero_grad()
            updates += 1
            if not resume and updates == a.preempt_at:
                msd, osd = get_state_dict(model, opt)
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt_dir)
                if rank == 0:
                    with open(os.path.join(ckpt_dir, "trainer.json"), "w") as f:
                        json.dump({"micro_step": i + 1, "updates": updates}, f)
                dist.barrier()
                return None
    return model


def main():
    a = get_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    box = [tempfile.mkdtemp(prefix="fsdp2_ckpt_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt_dir = box[0]

    run_phase(a, mesh, ckpt_dir, resume=False)
    model = run_phase(a, mesh, ckpt_dir, resume=True)

    flat = []
    for _, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        flat.append(t.detach().float().reshape(-1))
    digest = hashlib.sha256(torch.cat(flat).numpy().tobytes()).hexdigest()
    if dist.get_rank() == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
