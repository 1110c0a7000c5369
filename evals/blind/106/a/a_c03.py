"""Tagging model trained with the HF Trainer, preempted after 5 optimizer steps (mid-epoch) and
resumed from its checkpoint by a fresh Trainer.

The model is a plain nn.Module whose forward takes **kwargs, so the Trainer hands it
`num_items_in_batch` (all ranks' count of non-ignored labels in the window) and does
not divide the loss by GA itself. The embedding table is frozen; the encoder and the
classifier get their own AdamW groups through a `create_optimizer` override.
"""
import hashlib
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

SEED = 21
VOCAB, TAGS, SEQ = 50, 5, 16
ROWS = 96          # 2 ranks x 4 x 12 micro-batches -> 3 windows of K=4 per epoch
MAX_STEPS = 12


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.encoder = nn.GRU(32, 32, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(64, TAGS)
        self.embed.weight.requires_grad_(False)

    def forward(self, input_ids, labels=None, **kwargs):
        h, _ = self.encoder(self.embed(input_ids))
        logits = self.classifier(h)
        out = {"logits": logits}
        if labels is not None:
            tok = F.cross_entropy(logits.reshape(-1, TAGS), labels.reshape(-1), ignore_index=-100,
                                  reduction="sum")
            denom = kwargs.get("num_items_in_batch")
            out["loss"] = tok / (denom if denom is not None else labels.ne(-100).sum())
        return out


def build_rows():
    g = torch.Generator().manual_seed(SEED)
    rows = []
    for _ in range(ROWS):
        n = int(torch.randint(5, SEQ + 1, (1,), generator=g))
        ids = torch.randint(1, VOCAB, (SEQ,), generator=g)
        labels = (ids * 3 + torch.roll(ids, 1)) % TAGS
        labels[n:] = -100
        ids[n:] = 0
        rows.append({"input_ids": ids, "labels": labels})
    return rows


class TaggerTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            m = self.model
            self.optimizer = torch.optim.AdamW([
                {"params": m.encoder.parameters(), "lr": 3e-3, "weight_decay": 0.01},
                {"params": m.classifier.parameters(), "lr": 1e-2, "weight_decay": 0.0},
            ])
        return self.optimizer


class Preempt(TrainerCallback):
    def __init__(self, at):
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            control.should_save = True
            control.should_training_stop = True


def make_trainer(out, callbacks):
    set_seed(SEED)
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=4,
        max_steps=MAX_STEPS, lr_scheduler_type="linear", warmup_steps=2, max_grad_norm=1.0,
        seed=SEED, data_seed=SEED, report_to="none", save_strategy="no", logging_steps=1000,
        disable_tqdm=True, remove_unused_columns=False, use_cpu=True,
    )
    return TaggerTrainer(model=Tagger(), args=args, train_dataset=build_rows(), callbacks=callbacks)


def main():
    torch.use_deterministic_algorithms(True)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c03_out")
    first = make_trainer(out, [Preempt(5)])
    first.train()
    first.accelerator.wait_for_everyone()
    del first

    second = make_trainer(out, [])
    second.train(resume_from_checkpoint=os.path.join(out, "checkpoint-5"))
    if second.accelerator.is_main_process:
        flat = torch.cat([p.detach().float().reshape(-1).cpu()
                          for _, p in second.model.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
