"""Causal-LM SFT on a tiny random Llama with the stock HF Trainer and a callback
that owns the learning-rate curve (linear warm-up, cosine decay to a floor).

Run: torchrun --nproc-per-node 2 ... b_b03.py
"""
import argparse
import hashlib
import math
import os

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--warmup-frac", type=float, default=0.25)
    p.add_argument("--min-lr-ratio", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


class WarmupCosineCallback(TrainerCallback):
    """Sets every param group's LR at the start of each optimizer step."""

    def __init__(self, warmup_frac, min_ratio):
        self.warmup_frac = warmup_frac
        self.min_ratio = min_ratio

    def on_train_begin(self, args, state, control, optimizer=None, train_dataloader=None, **kwargs):
        self.base_lrs = [g["initial_lr"] if "initial_lr" in g else g["lr"] for g in optimizer.param_groups]
        steps_per_epoch = len(train_dataloader)
        self.total = int(steps_per_epoch * args.num_train_epochs)
        self.warmup = max(1, int(self.warmup_frac * self.total))

    def factor(self, step):
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        f = self.factor(state.global_step)
        for g, base in zip(optimizer.param_groups, self.base_lrs):
            g["lr"] = base * f


class PromptCompletionData(torch.utils.data.Dataset):
    def __init__(self, n, vocab, seq, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, seq), generator=g)
        self.labels = self.ids.clone()
        plen = torch.randint(3, seq - 4, (n,), generator=g)
        for i in range(n):
            self.labels[i, : plen[i]] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    a = parse_args()
    set_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum,
        num_train_epochs=a.epochs,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        seed=a.seed,
        data_seed=a.seed,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=PromptCompletionData(a.samples, cfg.vocab_size, 24, a.seed),
        callbacks=[WarmupCosineCallback(a.warmup_frac, a.min_lr_ratio)],
    )
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"FINAL_SHA256 {param_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
