"""Fine-tune a small text-classifier backbone on a new label set with Accelerate.

The pretrained head is replaced by a fresh one sized for the task's classes.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import set_seed


@dataclass
class Config:
    vocab: int = 64
    dim: int = 32
    seq: int = 12
    n_pretrain_classes: int = 10
    n_classes: int = 5
    per_device_batch: int = 4
    grad_accum: int = 4
    lr: float = 3e-3
    n_samples: int = 256
    seed: int = 1234


class Classifier(nn.Module):
    def __init__(self, cfg, n_out):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.encoder = nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.GELU(), nn.Linear(cfg.dim, cfg.dim))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, n_out)

    def forward(self, ids):
        h = self.encoder(self.embed(ids)).mean(dim=1)
        return self.head(self.norm(h))


def init_task_head(model, n_classes):
    """Swap the pretraining head for one sized to the downstream label set."""
    old = model.head
    model.head = nn.Linear(old.in_features, n_classes).to(old.weight.device)
    nn.init.zeros_(model.head.bias)


def make_data(cfg):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq), generator=g)
    labels = (ids[:, :3].sum(dim=1) % cfg.n_classes)
    return TensorDataset(ids, labels)


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Config()
    set_seed(cfg.seed)
    accelerator = Accelerator(
        gradient_accumulation_steps=cfg.grad_accum,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        cpu=True,
    )
    model = Classifier(cfg, cfg.n_pretrain_classes)
    loader = DataLoader(make_data(cfg), batch_size=cfg.per_device_batch, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))

    init_task_head(model, cfg.n_classes)
    model = accelerator.prepare(model)

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    optimizer, loader = accelerator.prepare(optimizer, loader)
    loss_fn = nn.CrossEntropyLoss()

    model.train()
    for step, (ids, labels) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = loss_fn(model(ids), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients and accelerator.is_main_process and (step + 1) % 16 == 0:
            print(f"micro {step + 1} loss {loss.item():.4f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("FINAL_SHA256", sha_of(accelerator.unwrap_model(model)))
    accelerator.end_training()


if __name__ == "__main__":
    main()
