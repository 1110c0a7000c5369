"""Click-through-rate model (embeddings + MLP) with Lightning Fabric DDP, 2 processes."""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from torch.utils.data import DataLoader, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--n-fields", type=int, default=6)
    p.add_argument("--field-size", type=int, default=50)
    p.add_argument("--emb-dim", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--max-grad-norm", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class CTRModel(nn.Module):
    def __init__(self, n_fields, field_size, dim):
        super().__init__()
        self.emb = nn.Embedding(n_fields * field_size, dim)
        self.register_buffer("offsets", torch.arange(n_fields) * field_size)
        self.mlp = nn.Sequential(nn.Linear(n_fields * dim, 64), nn.ReLU(),
                                 nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        e = self.emb(x + self.offsets)
        return self.mlp(e.flatten(1)).squeeze(-1)


class CTRTrainer:
    def __init__(self, fabric, args, model, optimizer, loader):
        self.fabric, self.args = fabric, args
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.updates = 0

    def _micro_step(self, batch, sync):
        x, y = batch
        with self.fabric.no_backward_sync(self.model, enabled=not sync):
            logits = self.model(x)
            loss = F.binary_cross_entropy_with_logits(logits, y) / self.args.accum_steps
            self.fabric.backward(loss)
        return loss.detach()

    def _optimizer_step(self):
        self.fabric.clip_gradients(self.model, self.optimizer, max_norm=self.args.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1

    def train_epoch(self):
        K = self.args.accum_steps
        for i, batch in enumerate(self.loader):
            sync = (i + 1) % K == 0
            self._micro_step(batch, sync)
            if sync:
                self._optimizer_step()

    def fit(self):
        for _ in range(self.args.epochs):
            self.train_epoch()


def make_dataset(args, n):
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randint(0, args.field_size, (n, args.n_fields), generator=g)
    w = torch.randn(args.n_fields, args.field_size, generator=g)
    score = w.gather(1, x.t()).sum(0)
    y = (score + 0.3 * torch.randn(n, generator=g) > 0).float()
    return TensorDataset(x, y)


def main():
    args = get_args()
    fabric = Fabric(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(args.seed)
    model = CTRModel(args.n_fields, args.field_size, args.emb_dim)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    # 2 ranks x 12 micro-batches per epoch: 3 windows of 4 per epoch
    loader = DataLoader(make_dataset(args, 2 * 12 * args.batch_size), batch_size=args.batch_size,
                        shuffle=False)
    loader = fabric.setup_dataloaders(loader)
    trainer = CTRTrainer(fabric, args, model, optimizer, loader)
    trainer.fit()
    flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
    if fabric.global_rank == 0:
        print(f"optimizer updates {trainer.updates}")
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
