"""Full fine-tune of a tiny Llama with the HF Trainer plus a PaLM-style z-loss.

The z-loss keeps the softmax normaliser near zero. It is a per-sequence average, so it
is scaled the way the Trainer scales its own token-normalised loss.
"""
import hashlib
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class RunConfig:
    seed: int = 7
    vocab: int = 96
    pad_id: int = 0
    n_train: int = 64
    micro_batch: int = 2
    grad_accum: int = 4
    epochs: int = 3
    lr: float = 3e-3
    z_loss_coef: float = 2e-2


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class SyntheticLM(torch.utils.data.Dataset):
    def __init__(self, cfg: RunConfig):
        rng = random.Random(cfg.seed)
        self.rows = []
        for _ in range(cfg.n_train):
            n = rng.randint(5, 18)
            ids = [rng.randint(1, cfg.vocab - 1) for _ in range(n)]
            self.rows.append(ids)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i]}


def make_collator(pad_id):
    def collate(features):
        width = max(len(f["input_ids"]) for f in features)
        out = {"input_ids": [], "attention_mask": [], "labels": []}
        for f in features:
            ids = f["input_ids"]
            pad = width - len(ids)
            out["input_ids"].append(ids + [pad_id] * pad)
            out["attention_mask"].append([1] * len(ids) + [0] * pad)
            out["labels"].append(ids + [-100] * pad)
        return {k: torch.tensor(v) for k, v in out.items()}

    return collate


class ZLossTrainer(Trainer):
    def __init__(self, *args, z_loss_coef=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.z_loss_coef = z_loss_coef

    def _z_loss(self, logits, attention_mask):
        # per-sequence mean of log(Z)^2, then mean over the micro-batch's sequences
        lse = torch.logsumexp(logits.float(), dim=-1)
        m = attention_mask.float()
        per_seq = (lse.pow(2) * m).sum(-1) / m.sum(-1)
        return per_seq.mean()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        lm_loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        # The Trainer's LM loss is already over the whole accumulated batch (times the
        # number of processes, undone by DDP's average). Put the per-micro-batch z-loss
        # on the same footing: / accumulation steps, x processes.
        acc = self.accelerator
        z = self._z_loss(outputs.logits, inputs["attention_mask"])
        z = z * acc.num_processes / acc.gradient_accumulation_steps
        loss = lm_loss + self.z_loss_coef * z
        return (loss, outputs) if return_outputs else loss


def final_hash(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main(cfg: RunConfig):
    seed_everything(cfg.seed)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg.vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=cfg.pad_id, tie_word_embeddings=True,
        )
    )
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_b02_out"),
        per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=0.0,
        weight_decay=0.0,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        ddp_backend="gloo",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = ZLossTrainer(
        model=model, args=args, train_dataset=SyntheticLM(cfg),
        data_collator=make_collator(cfg.pad_id), z_loss_coef=cfg.z_loss_coef,
    )
    trainer.train()
    if trainer.is_world_process_zero():
        print("FINAL_SHA256", final_hash(trainer.model), flush=True)


if __name__ == "__main__":
    main(RunConfig())
