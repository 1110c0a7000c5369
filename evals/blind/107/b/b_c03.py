"""FSDP2 token classifier (torchrun, 2 ranks) with a vocabulary grown before sharding,
two AdamW parameter groups (embeddings at a lower LR, no decay), bf16 compute with fp32
reduction, a clip, and a sharded torch.distributed.checkpoint save at a window
boundary followed by a resume into freshly built objects.

The micro-step counter runs continuously across epochs: an epoch has 10 micro-batches
per rank and K = 4, so some windows start in one epoch and finish in the next (the
large batch is any K x W consecutive micro-batches; the epoch boundary is only a
reshuffle).
"""
import hashlib
import os
import shutil
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Args:
    old_vocab: int = 50
    new_vocab: int = 64
    seq: int = 12
    micro_bs: int = 4
    accum: int = 4
    per_epoch: int = 10           # micro-batches per rank per epoch
    total_updates: int = 7        # 28 micro-batches: windows cross the epoch boundaries
    ckpt_after_updates: int = 3
    lr: float = 3e-3
    emb_lr: float = 1e-3
    clip: float = 1.0
    seed: int = 5


class TokenTagger(nn.Module):
    def __init__(self, vocab, d=32, n_tags=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))
        self.norm = nn.LayerNorm(d)
        self.tag = nn.Linear(d, n_tags)

    def forward(self, ids):
        h = self.emb(ids)
        return self.tag(self.norm(h + self.enc(h)))


def grow_vocab(model, new_vocab):
    old = model.emb
    emb = nn.Embedding(new_vocab, old.embedding_dim)
    with torch.no_grad():
        emb.weight[: old.num_embeddings] = old.weight
        emb.weight[old.num_embeddings:] = old.weight.mean(0, keepdim=True)
    model.emb = emb


class Trainer:
    def __init__(self, a, rank, world):
        self.a, self.rank, self.world = a, rank, world
        g = torch.Generator().manual_seed(a.seed + 17)
        n = a.per_epoch * a.micro_bs * world
        self.ids = torch.randint(a.new_vocab, (n, a.seq), generator=g)
        self.tags = (self.ids % 6 + (self.ids // 13)) % 6
        self.ckpt_dir = os.path.join(HERE, "tmp_scratch", os.path.basename(__file__) + ".dcp")
        self.build()

    def build(self):
        a = self.a
        torch.manual_seed(a.seed)
        m = TokenTagger(a.old_vocab)
        grow_vocab(m, a.new_vocab)
        pol = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(m.enc, mp_policy=pol)
        fully_shard(m, mp_policy=pol)
        self.model = m
        self.opt = torch.optim.AdamW([
            {"params": [m.emb.weight], "lr": a.emb_lr, "weight_decay": 0.0},
            {"params": [p for n, p in m.named_parameters() if not n.startswith("emb")], "weight_decay": 0.05},
        ], lr=a.lr)
        self.sched = torch.optim.lr_scheduler.LinearLR(self.opt, start_factor=0.3, total_iters=a.total_updates)
        self.micro = 0

    def order(self, epoch):
        g = torch.Generator().manual_seed(self.a.seed * 100 + epoch)
        return torch.randperm(self.a.per_epoch * self.world, generator=g)

    def micro_batch(self, micro):
        a = self.a
        epoch, pos = divmod(micro, a.per_epoch)
        slot = self.order(epoch)[pos * self.world + self.rank].item()
        lo = slot * a.micro_bs
        return self.ids[lo: lo + a.micro_bs], self.tags[lo: lo + a.micro_bs]

    def train(self, updates):
        a = self.a
        while self.micro < updates * a.accum:
            last = (self.micro + 1) % a.accum == 0
            self.model.set_requires_gradient_sync(last)
            ids, tags = self.micro_batch(self.micro)
            logits = self.model(ids).float()
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tags.view(-1))
            (loss / a.accum).backward()
            self.micro += 1
            if last:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.clip)
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)

    def save(self):
        msd, osd = get_state_dict(self.model, self.opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=self.ckpt_dir)
        if self.rank == 0:
            torch.save({"sched": self.sched.state_dict(), "micro": self.micro},
                       os.path.join(self.ckpt_dir, "trainer_state.pt"))
        dist.barrier()

    def load(self):
        self.build()
        msd, osd = get_state_dict(self.model, self.opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=self.ckpt_dir)
        set_state_dict(self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        extra = torch.load(os.path.join(self.ckpt_dir, "trainer_state.pt"), weights_only=False)
        self.sched.load_state_dict(extra["sched"])
        self.micro = extra["micro"]
        dist.barrier()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    a = Args()
    tr = Trainer(a, rank, world)
    tr.train(a.ckpt_after_updates)
    tr.save()
    tr.load()
    tr.train(a.total_updates)
    h = hashlib.sha256()
    for _, p in tr.model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
        shutil.rmtree(tr.ckpt_dir, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
