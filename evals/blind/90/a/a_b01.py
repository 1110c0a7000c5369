"""Tabular regression fine-tune with the HF Trainer: a subclass adds a warm-up + cosine
schedule sized from the dataset, K=4 micro-batches per update on 2 ranks."""
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, get_cosine_schedule_with_warmup, set_seed

SEED = 1234
N_FEAT, N_OUT = 16, 4


class SyntheticRows(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, N_FEAT, generator=g)
        w = torch.randn(N_FEAT, N_OUT, generator=g)
        self.y = torch.tanh(self.x @ w) * 3.0 + 0.1 * torch.randn(n, N_OUT, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_FEAT, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, N_OUT))

    def forward(self, x, y=None):
        out = self.net(x)
        loss = F.mse_loss(out, y) if y is not None else None
        return {"loss": loss, "logits": out}


class WarmCosineTrainer(Trainer):
    """Linear warm-up over the first 10% of training, then cosine decay to zero."""

    warmup_ratio_ = 0.1

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            steps_per_epoch = math.ceil(len(self.train_dataset) / self.args.per_device_train_batch_size)
            total = steps_per_epoch * int(self.args.num_train_epochs)
            self.lr_scheduler = get_cosine_schedule_with_warmup(
                optimizer,
                num_warmup_steps=max(1, int(self.warmup_ratio_ * total)),
                num_training_steps=total,
            )
        return self.lr_scheduler


def main():
    set_seed(SEED)
    model = Regressor()
    train_ds = SyntheticRows(256, SEED)  # 2 ranks x 4 x K=4 -> 32 per update, 8 updates per epoch
    args = TrainingArguments(
        output_dir="/tmp/blind90_a_b01_out",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=3e-3,
        weight_decay=0.0,
        max_grad_norm=5.0,
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
    )
    trainer = WarmCosineTrainer(model=model, args=args, train_dataset=train_ds)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
