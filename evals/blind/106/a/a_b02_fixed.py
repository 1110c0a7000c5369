"""Packed-sequence SFT with an HF Trainer subclass and a per-epoch token budget.

Each training example packs several short "documents" into one row of SEQ_LEN
tokens (position ids restart at every document, the first token of every
document is not a target).  The loss is a token-level cross entropy summed over
the window and normalised by the Trainer's `num_items_in_batch`.  A callback
caps every epoch at a budget of non-padding input tokens (curriculum style:
we only want to see the head of each shuffled epoch).
"""
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)


@dataclass
class RunConfig:
    vocab: int = 96
    seq_len: int = 32
    n_rows: int = 48
    micro_bs: int = 2
    grad_accum: int = 4
    epochs: int = 4
    lr: float = 3e-3
    tokens_per_epoch: int = 700  # all ranks, non-padding tokens
    seed: int = 1234


def make_rows(cfg: RunConfig):
    g = np.random.default_rng(cfg.seed)
    rows = []
    for _ in range(cfg.n_rows):
        ids, pos, lab = [], [], []
        used = int(g.integers(cfg.seq_len // 2, cfg.seq_len + 1))
        while len(ids) < used:
            n = int(g.integers(3, 10))
            doc = g.integers(1, cfg.vocab, size=n).tolist()
            ids += doc
            pos += list(range(n))
            lab += [-100] + doc[1:]
        ids, pos, lab = ids[:used], pos[:used], lab[:used]
        pad = cfg.seq_len - used
        rows.append({
            "input_ids": torch.tensor(ids + [0] * pad),
            "position_ids": torch.tensor(pos + [0] * pad),
            "attention_mask": torch.tensor([1] * used + [0] * pad),
            "labels": torch.tensor(lab + [-100] * pad),
        })
    return rows


class PackedRows(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def packed_token_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1, :].float()
    tgt = labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                           ignore_index=-100, reduction="sum")
    if num_items_in_batch is None:
        num_items_in_batch = (tgt != -100).sum()
    return loss / num_items_in_batch


class PackedSFTTrainer(Trainer):
    """Keeps the packing metadata; everything else is the stock loop."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        inputs["position_ids"] = inputs["position_ids"].long()
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


class EpochTokenBudget(TrainerCallback):
    """Stop each epoch once `budget` non-padding tokens (all ranks) were consumed."""

    def __init__(self, budget):
        self.budget = budget
        self.epoch_start = 0

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.epoch_start = state.num_input_tokens_seen

    def _check(self, state, control):
        if state.num_input_tokens_seen - self.epoch_start >= self.budget:
            control.should_epoch_stop = True
        return control

    def on_step_end(self, args, state, control, **kwargs):
        return self._check(state, control)


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=cfg.vocab, n_positions=cfg.seq_len, n_embd=32,
                                       n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", os.path.basename(__file__)[:-3] + "_out")
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=cfg.micro_bs,
        gradient_accumulation_steps=cfg.grad_accum, num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr, lr_scheduler_type="linear", warmup_steps=2,
        max_grad_norm=1.0, weight_decay=0.0, seed=cfg.seed, data_seed=cfg.seed,
        include_num_input_tokens_seen="non_padding", report_to="none",
        save_strategy="no", logging_steps=1000, disable_tqdm=True,
        remove_unused_columns=False, use_cpu=True, dataloader_num_workers=0,
    )
    trainer = PackedSFTTrainer(model=model, args=args, train_dataset=PackedRows(make_rows(cfg)),
                               compute_loss_func=packed_token_loss,
                               callbacks=[EpochTokenBudget(cfg.tokens_per_epoch)])
    trainer.train()
    if trainer.accelerator.is_main_process:
        flat = torch.cat([p.detach().float().reshape(-1).cpu()
                          for _, p in trainer.model.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
