"""Reward-model training (Bradley-Terry over chosen/rejected pairs) with Lightning Fabric on
2 ranks: micro-batches hold uneven numbers of pairs, each window's loss is normalised by the
window's all-ranks pair count (x W against DDP's mean), K=3 with a short last window per epoch,
two optimizers (backbone / reward head), no_backward_sync and a clip that acts."""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from lightning_fabric.strategies import DDPStrategy

SEED, DIM = 5, 16
K = 3
MICRO_PER_EPOCH = 8  # windows of 3, 3 and a short one of 2
EPOCHS = 2
MAX_NORM = 0.25


class RewardModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(DIM, 40), nn.SiLU(), nn.Linear(40, 40), nn.SiLU())
        self.reward_head = nn.Linear(40, 1)

    def forward(self, feats):
        return self.reward_head(self.backbone(feats)).squeeze(-1)


def make_epoch(rank, epoch, true_w):
    g = torch.Generator().manual_seed(1000 * SEED + 10 * epoch + rank)
    batches = []
    for i in range(MICRO_PER_EPOCH):
        n_pairs = 2 + (3 * i + 5 * rank + epoch) % 5
        a = torch.randn(n_pairs, DIM, generator=g)
        b = torch.randn(n_pairs, DIM, generator=g)
        a_better = (a @ true_w) > (b @ true_w)
        chosen = torch.where(a_better.unsqueeze(1), a, b)
        rejected = torch.where(a_better.unsqueeze(1), b, a)
        batches.append((chosen, rejected))
    return batches


def windows(batches, k):
    for start in range(0, len(batches), k):
        yield batches[start:start + k]


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"))
    fabric.launch()
    fabric.seed_everything(SEED)
    true_w = torch.randn(DIM, generator=torch.Generator().manual_seed(SEED))

    model = RewardModel()
    body_opt = torch.optim.AdamW(model.backbone.parameters(), lr=2e-3, weight_decay=0.01)
    head_opt = torch.optim.SGD(model.reward_head.parameters(), lr=2e-2, momentum=0.9)
    model, body_opt, head_opt = fabric.setup(model, body_opt, head_opt)
    world = fabric.world_size

    for epoch in range(EPOCHS):
        for window in windows(make_epoch(fabric.global_rank, epoch, true_w), K):
            local_pairs = torch.tensor(float(sum(c.shape[0] for c, _ in window)))
            window_pairs = fabric.all_reduce(local_pairs, reduce_op="sum")
            for j, (chosen, rejected) in enumerate(window):
                last = j == len(window) - 1
                with fabric.no_backward_sync(model, enabled=not last):
                    margin = model(chosen) - model(rejected)
                    loss = -F.logsigmoid(margin).sum() * world / window_pairs
                    fabric.backward(loss)
            fabric.clip_gradients(model, body_opt, max_norm=MAX_NORM)
            body_opt.step()
            head_opt.step()
            body_opt.zero_grad()
            head_opt.zero_grad()

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    fabric.barrier()


if __name__ == "__main__":
    main()
