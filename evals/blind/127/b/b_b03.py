"""Tabular risk model trained with the HF Trainer.

The subclass overrides ``training_step`` so the auxiliary ranking term gets its own
backward (keeps the activation memory of the two heads apart).
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, set_seed


RUN_NAME = os.path.splitext(os.path.basename(__file__))[0]


@dataclass
class RunConfig:
    n_features: int = 24
    hidden: int = 64
    n_rows: int = 80           # 40 rows / rank -> 10 micro-batches of 4 per epoch
    per_device_bs: int = 4
    grad_accum: int = 4        # windows of 4, 4, 2 per epoch
    epochs: int = 2
    lr: float = 0.05
    aux_weight: float = 0.3
    seed: int = 1234


class RiskRows(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        self.x = torch.randn(cfg.n_rows, cfg.n_features, generator=g)
        w = torch.randn(cfg.n_features, generator=g)
        self.y = (self.x @ w + 0.3 * torch.randn(cfg.n_rows, generator=g) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "labels": self.y[i]}


class RiskNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(cfg.n_features, cfg.hidden), nn.Tanh(),
                                  nn.Linear(cfg.hidden, cfg.hidden), nn.Tanh())
        self.cls = nn.Linear(cfg.hidden, 2)
        self.score = nn.Linear(cfg.hidden, 1)

    def forward(self, features, labels=None):
        h = self.body(features)
        return {"logits": self.cls(h), "score": self.score(h).squeeze(-1)}


class TwoBackwardTrainer(Trainer):
    def __init__(self, *a, aux_weight=0.3, **kw):
        super().__init__(*a, **kw)
        self.aux_weight = aux_weight

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        labels = inputs["labels"]
        out = model(features=inputs["features"])
        ce = F.cross_entropy(out["logits"], labels)
        # pairwise-free ranking surrogate on the score head
        aux = F.binary_cross_entropy_with_logits(out["score"], labels.float())
        loss = ce + self.aux_weight * aux
        loss = loss / self.args.gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    model = RiskNet(cfg)
    args = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", "out_" + RUN_NAME),
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_drop_last=False,
        remove_unused_columns=False,
        seed=cfg.seed,
        disable_tqdm=True,
    )
    trainer = TwoBackwardTrainer(model=model, args=args, train_dataset=RiskRows(cfg),
                                 aux_weight=cfg.aux_weight)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"world_size={trainer.args.world_size} global_step={trainer.state.global_step}", flush=True)
        torch.save({n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()},
                   os.path.join("tmp_scratch", RUN_NAME + ".params.pt"))
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
