"""Calibrated intent classifier: HF Trainer subclass with a learned softmax temperature."""
import hashlib
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

VOCAB, N_CLASSES, SEQ = 96, 5, 12


class IntentDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
        self.labels = (self.ids[:, :3].sum(-1) % N_CLASSES)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class BagClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, N_CLASSES))

    def forward(self, input_ids, labels=None):
        return self.mlp(self.emb(input_ids).mean(1))


class _AverageTemperatureGrad(TrainerCallback):
    def __init__(self, p):
        self.p = p

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if dist.is_initialized() and self.p.grad is not None:
            dist.all_reduce(self.p.grad, op=dist.ReduceOp.AVG)


class TemperatureTrainer(Trainer):
    """Learns a global temperature jointly with the classifier (calibration-aware training)."""

    def __init__(self, *args, init_temp=1.5, temp_lr=5e-2, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_temp = nn.Parameter(torch.tensor(float(np.log(init_temp))))
        self.temp_lr = temp_lr
        self.add_callback(_AverageTemperatureGrad(self.log_temp))

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            model = model if model is not None else self.model
            self.optimizer = torch.optim.AdamW(
                [
                    {"params": [p for p in model.parameters() if p.requires_grad], "lr": self.args.learning_rate},
                    {"params": [self.log_temp], "lr": self.temp_lr, "weight_decay": 0.0},
                ],
                weight_decay=self.args.weight_decay,
            )
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        logits = model(**inputs)
        loss = F.cross_entropy(logits / self.log_temp.exp(), labels)
        return (loss, logits) if return_outputs else loss


def main():
    set_seed(0)
    torch.use_deterministic_algorithms(True)
    args = TrainingArguments(
        output_dir="tmp_scratch/b01_out",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=3e-3,
        weight_decay=0.01,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        ddp_backend="gloo",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = TemperatureTrainer(
        model=BagClassifier(), args=args, train_dataset=IntentDataset(192, seed=1), init_temp=1.5, temp_lr=5e-2
    )
    trainer.train()

    rank = dist.get_rank() if dist.is_initialized() else 0
    model = trainer.accelerator.unwrap_model(trainer.model)
    if rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
                   f"tmp_scratch/{os.path.splitext(os.path.basename(__file__))[0]}.pt")


if __name__ == "__main__":
    main()
