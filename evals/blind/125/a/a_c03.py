"""DDP trainer with gradual unfreezing (ULMFiT style), done by re-wrapping.

The embedding and the lower encoder start frozen. At the start of epoch 1 the
lower encoder is released, at epoch 2 the embedding; each time the trainer adds
a parameter group and rebuilds the DDP wrapper so the reducer covers the newly
trainable parameters. A DataLoader worker feeds 10 micro-batches per rank and
epoch, cut into windows of 4, 4 and 2, each averaged over its own length.
"""
import gc
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 5150
VOCAB, DIM, SEQ, CLASSES = 60, 32, 12, 4
MICRO_BS, ACCUM, EPOCHS = 4, 4, 3
N_SAMPLES = 80
UNFREEZE = {1: "lower", 2: "embed"}
GROUP_LR = {"lower": 1e-3, "embed": 5e-4}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.lower = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())
        self.upper = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, ids):
        h = self.upper(self.lower(self.embed(ids)))
        return self.head(h.max(dim=1).values)


def make_dataset():
    g = torch.Generator().manual_seed(SEED + 3)
    ids = torch.randint(0, VOCAB, (N_SAMPLES, SEQ), generator=g)
    y = (ids.max(dim=1).values // 15).clamp(max=CLASSES - 1)
    return TensorDataset(ids, y)


class GradualUnfreezeTrainer:
    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(SEED)
        self.model = Classifier()
        for name in ("embed", "lower"):
            getattr(self.model, name).requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(trainable, lr=2e-3, weight_decay=0.0)
        self.ddp = None
        self._wrap()
        ds = make_dataset()
        self.sampler = DistributedSampler(ds, num_replicas=self.world, rank=self.rank, shuffle=True, seed=SEED)
        self.loader = DataLoader(ds, batch_size=MICRO_BS, sampler=self.sampler, num_workers=1)

    def _wrap(self):
        if self.ddp is not None:
            del self.ddp
            gc.collect()
        self.ddp = DDP(self.model)

    def unfreeze(self, name):
        module = getattr(self.model, name)
        module.requires_grad_(True)
        self.opt.add_param_group({"params": list(module.parameters()), "lr": GROUP_LR[name], "weight_decay": 0.0})
        self._wrap()
        if self.rank == 0:
            print(f"unfroze {name}; rebuilt DDP")

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        batches = list(self.loader)
        for start in range(0, len(batches), ACCUM):
            window = batches[start:start + ACCUM]
            for j, (ids, y) in enumerate(window):
                last = j == len(window) - 1
                with (nullcontext() if last else self.ddp.no_sync()):
                    loss = F.cross_entropy(self.ddp(ids), y) / len(window)
                    loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if self.rank == 0:
            print(f"epoch {epoch} windows {len(range(0, len(batches), ACCUM))} last loss {loss.item() * len(window):.4f}")

    def fit(self):
        for epoch in range(EPOCHS):
            if epoch in UNFREEZE:
                self.unfreeze(UNFREEZE[epoch])
            self.train_epoch(epoch)

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    dist.init_process_group("gloo")
    trainer = GradualUnfreezeTrainer()
    trainer.fit()
    if dist.get_rank() == 0:
        print("FINAL_SHA256", trainer.digest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
