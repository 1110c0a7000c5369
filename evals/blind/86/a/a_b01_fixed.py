"""Regression head fine-tuning with the HF Trainer (custom optimizer, plain-SGD recipe).

Launch: torchrun --nproc-per-node 2 ... a_b01.py
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed


@dataclass
class RecipeConfig:
    lr: float = 0.02
    momentum: float = 0.9
    per_device_bs: int = 4
    grad_accum: int = 4
    epochs: int = 2
    seed: int = 1234
    # The recipe trains without gradient clipping (the paper's SGD setting).
    grad_clip: float = 0.0
    out_dir: str = field(default_factory=lambda: "/tmp/wa86/hf_b01_out")


class ToyRegression(Dataset):
    def __init__(self, n=128, dim=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, 1, generator=g) * 3.0
        self.y = (self.x @ w).squeeze(-1) + 0.1 * torch.randn(n, generator=g) + 4.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "target": self.y[i]}


class MLPRegressor(nn.Module):
    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 1)

    def forward(self, features, target=None):
        pred = self.head(self.body(features)).squeeze(-1)
        out = {"pred": pred}
        if target is not None:
            out["loss"] = nn.functional.mse_loss(pred, target)
        return out


class SGDTrainer(Trainer):
    """Trainer with the recipe's SGD + momentum instead of AdamW."""

    def __init__(self, *args, recipe: RecipeConfig, **kwargs):
        self.recipe = recipe
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.SGD(params, lr=self.recipe.lr, momentum=self.recipe.momentum)
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = outputs["loss"]
        return (loss, outputs) if return_outputs else loss


class StepPrinter(TrainerCallback):
    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            print(f"finished after {state.global_step} optimizer steps")


def build_args(cfg: RecipeConfig) -> TrainingArguments:
    return TrainingArguments(
        output_dir=cfg.out_dir,
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        max_grad_norm=cfg.grad_clip,
    )


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RecipeConfig()
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    model = MLPRegressor()
    args = build_args(cfg)
    trainer = SGDTrainer(
        model=model,
        args=args,
        train_dataset=ToyRegression(),
        recipe=cfg,
        callbacks=[StepPrinter()],
    )
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {params_sha256(trainer.model)}")


if __name__ == "__main__":
    main()
