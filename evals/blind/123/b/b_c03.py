"""HF Trainer subclass, interrupted and resumed from its own checkpoint.

The first Trainer is stopped by a callback after 5 optimizer steps (checkpoints every 2),
a second Trainer built from scratch resumes with `resume_from_checkpoint`. GA 2, 2 ranks,
shuffled data, a frozen embedding table and a two-group optimizer made in `create_optimizer`.
"""
import hashlib
import os
import shutil
import sys

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, default_data_collator, set_seed)

SEED, VOCAB, SEQ = 21, 60, 12
OUT = "tmp_scratch/b_c03_out"
STOP_AT = int(sys.argv[1]) if len(sys.argv) > 1 else 5


class Rows(Dataset):
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(SEED)
        self.x = torch.randint(1, VOCAB, (n, SEQ), generator=g)
        self.x[:, 6:] = self.x[:, :6].roll(1, dims=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            control.should_training_stop = True
            control.should_save = False
        return control


class FrozenEmbTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            m = self.model
            emb = m.get_input_embeddings().weight
            body = [p for n, p in m.named_parameters() if p.requires_grad and p.ndim >= 2]
            small = [p for n, p in m.named_parameters() if p.requires_grad and p.ndim < 2]
            assert not emb.requires_grad
            self.optimizer = torch.optim.AdamW([
                {"params": body, "weight_decay": 0.05},
                {"params": small, "weight_decay": 0.0, "lr": self.args.learning_rate * 0.5},
            ], lr=self.args.learning_rate)
        return self.optimizer


def build():
    set_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=4, max_position_embeddings=32,
                                         tie_word_embeddings=False))
    model.get_input_embeddings().weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_train_epochs=3, learning_rate=4e-3, lr_scheduler_type="linear", warmup_steps=2,
        max_grad_norm=0.0, seed=SEED, use_cpu=True, ddp_backend="gloo",
        save_strategy="steps", save_steps=2, save_only_model=False,
        report_to="none", logging_strategy="no", disable_tqdm=True)
    return model, args


def main():
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        shutil.rmtree(OUT, ignore_errors=True)
    model, args = build()
    t1 = FrozenEmbTrainer(model=model, args=args, train_dataset=Rows(),
                          data_collator=default_data_collator, callbacks=[StopAt(STOP_AT)])
    t1.train()                       # "preempted" after STOP_AT steps
    model, args = build()            # a new job: fresh model, fresh trainer
    t2 = FrozenEmbTrainer(model=model, args=args, train_dataset=Rows(),
                          data_collator=default_data_collator)
    t2.train(resume_from_checkpoint=True)
    if t2.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in t2.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
