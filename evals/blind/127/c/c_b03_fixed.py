"""Response-level reward model (Bradley-Terry over chosen/rejected pairs), Lightning Fabric DDP on 2 CPU ranks.

Launch with torchrun; Fabric picks up the torchrun environment.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


@dataclass
class RMArgs:
    vocab: int = 48
    d_model: int = 32
    seq_len: int = 10
    n_pairs: int = 96
    micro_batch: int = 4
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 2024


class PairData(Dataset):
    def __init__(self, a: RMArgs):
        g = torch.Generator().manual_seed(a.seed)
        self.chosen = torch.randint(0, a.vocab, (a.n_pairs, a.seq_len), generator=g)
        self.rejected = torch.randint(0, a.vocab, (a.n_pairs, a.seq_len), generator=g)

    def __len__(self):
        return len(self.chosen)

    def __getitem__(self, i):
        return self.chosen[i], self.rejected[i]


class RewardModel(nn.Module):
    def __init__(self, a: RMArgs):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.d_model)
        self.enc = nn.GRU(a.d_model, a.d_model, batch_first=True)
        self.score = nn.Linear(a.d_model, 1)

    def forward(self, chosen, rejected):
        both = torch.cat([chosen, rejected], 0)
        h, _ = self.enc(self.emb(both))
        r = self.score(h[:, -1]).squeeze(-1)
        return r.chunk(2)


class RMTrainer:
    def __init__(self, fabric: Fabric, args: RMArgs):
        self.fabric = fabric
        self.args = args
        self.global_step = 0

    def _is_boundary(self, i):
        # i counts micro-batches within the epoch
        return (i + 1) % self.args.grad_accum == 0

    def _micro_step(self, model, batch, accumulate):
        chosen, rejected = batch
        with self.fabric.no_backward_sync(model, enabled=accumulate):
            r_c, r_r = model(chosen, rejected)
            loss = -F.logsigmoid(r_c - r_r).mean()
            self.fabric.backward(loss / self.args.grad_accum)
        return loss.detach()

    def _train_epoch(self, model, opt, loader, epoch):
        for step, batch in enumerate(loader):
            boundary = self._is_boundary(step)
            loss = self._micro_step(model, batch, accumulate=not boundary)
            if boundary:
                opt.step()
                opt.zero_grad(set_to_none=True)
                self.global_step += 1
                self.fabric.print(f"epoch {epoch} step {step} update {self.global_step} loss {loss.item():.4f}")

    def fit(self, model, opt, loader):
        for epoch in range(self.args.epochs):
            loader.sampler.set_epoch(epoch)
            self._train_epoch(model, opt, loader, epoch)


def main():
    args = RMArgs()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(args.seed)
    torch.use_deterministic_algorithms(True)

    model = RewardModel(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model, opt = fabric.setup(model, opt)

    ds = PairData(args)
    sampler = DistributedSampler(ds, num_replicas=fabric.world_size, rank=fabric.global_rank, shuffle=False)
    loader = fabric.setup_dataloaders(DataLoader(ds, batch_size=args.micro_batch, sampler=sampler),
                                      use_distributed_sampler=False)

    RMTrainer(fabric, args).fit(model, opt, loader)

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
