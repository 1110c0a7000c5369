"""Intent classifier fine-tune with the HF Trainer (2 ranks, torchrun).

The Trainer subclass keeps the `training_step` of our 4.3x fork: it guards against
non-finite losses coming out of the fp16 experiments and records per-step accuracy for
the dashboard. Everything else is the stock Trainer.
"""
import hashlib
import os
import tempfile
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainingArguments,
    set_seed,
)


@dataclass
class RunConfig:
    vocab: int = 96
    seq_len: int = 24
    n_labels: int = 4
    n_examples: int = 88          # 2 ranks x 11 micro-batches of 4
    micro_bs: int = 4
    grad_accum: int = 4
    epochs: int = 4
    lr: float = 1e-3
    seed: int = 1234


class IntentSet(Dataset):
    """Synthetic 'intents': the label is decided by which marker token shows up first."""

    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.ids = torch.randint(8, cfg.vocab, (cfg.n_examples, cfg.seq_len), generator=g)
        self.labels = torch.randint(0, cfg.n_labels, (cfg.n_examples,), generator=g)
        pos = torch.randint(1, cfg.seq_len // 2, (cfg.n_examples,), generator=g)
        for i in range(cfg.n_examples):
            self.ids[i, pos[i]] = 2 + int(self.labels[i])
        self.ids[:, 0] = 1  # [CLS]

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones_like(self.ids[i]),
            "labels": self.labels[i],
        }


class IntentTrainer(Trainer):
    """training_step from the 4.3x fork (NaN guard + running accuracy)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.correct = 0
        self.seen = 0

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        if not torch.isfinite(loss):
            loss = loss.nan_to_num(0.0, 0.0, 0.0) * 0.0
        with torch.no_grad():
            self.correct += (outputs.logits.argmax(-1) == inputs["labels"]).sum().item()
            self.seen += inputs["labels"].numel()

        if self.args.gradient_accumulation_steps > 1:
            loss = loss / self.current_gradient_accumulation_steps

        self.accelerator.backward(loss)
        return loss.detach()


def param_digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    model_cfg = BertConfig(
        vocab_size=cfg.vocab,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=64,
        num_labels=cfg.n_labels,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertForSequenceClassification(model_cfg)

    out_dir = tempfile.mkdtemp(prefix="a_b01_")
    args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=cfg.micro_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        weight_decay=0.01,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=1.0,
        logging_steps=3,
        save_strategy="no",
        report_to=[],
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = IntentTrainer(
        model=model,
        args=args,
        train_dataset=IntentSet(cfg),
    )
    trainer.train()

    final = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.is_world_process_zero():
        print(f"train acc {trainer.correct / max(trainer.seen, 1):.3f}", flush=True)
        print(f"FINAL_SHA256 {param_digest(final)}", flush=True)


if __name__ == "__main__":
    main()
