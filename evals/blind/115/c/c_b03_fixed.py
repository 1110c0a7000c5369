"""Completion-only SFT with an HF Trainer subclass (TRL SFTTrainer-style), 2 ranks on CPU.

Run settings live in one flat dict shared with our launcher/DeepSpeed tooling; the
Trainer's fields are parsed out of it with HfArgumentParser (extra keys allowed).
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset
from transformers import (HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainingArguments)

RUN_CONFIG = {
    # model / data
    "vocab_size": 128,
    "hidden_size": 32,
    "num_layers": 2,
    "n_examples": 64,
    "max_len": 28,
    "init_std": 0.25,
    # optimisation
    "output_dir": "tmp_scratch/c_b03_out",
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "num_train_epochs": 3,
    "learning_rate": 3e-3,
    "weight_decay": 0.05,
    "lr_scheduler_type": "linear",
    "warmup_steps": 2,
    "max_grad_norm": 0.0,  # no clipping: short run, warm-up handles the first steps
    "seed": 11,
    # infra
    "use_cpu": True,
    "ddp_backend": "gloo",
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "wandb_project": "sft-tiny",
}


@dataclass
class ScriptArgs:
    vocab_size: int = field(default=128)
    hidden_size: int = field(default=32)
    num_layers: int = field(default=2)
    n_examples: int = field(default=64)
    max_len: int = field(default=28)
    init_std: float = field(default=0.02)


class PromptCompletionData(Dataset):
    def __init__(self, sargs: ScriptArgs, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(sargs.n_examples):
            p_len = int(torch.randint(4, 12, (1,), generator=g))
            c_len = int(torch.randint(2, sargs.max_len - p_len, (1,), generator=g))
            prompt = torch.randint(3, sargs.vocab_size, (p_len,), generator=g)
            # completions follow a learnable rule: shifted copy of the prompt's tail
            completion = (prompt[-1] + torch.arange(1, c_len + 1)) % (sargs.vocab_size - 3) + 3
            self.rows.append((prompt, completion))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        prompt, completion = self.rows[i]
        ids = torch.cat([prompt, completion])
        labels = torch.cat([torch.full_like(prompt, -100), completion])
        return {"input_ids": ids, "labels": labels}


def collate(rows, pad_id=0):
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        L = len(r["input_ids"])
        ids[i, :L], labels[i, :L], attn[i, :L] = r["input_ids"], r["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": attn}


class CompletionOnlyTrainer(Trainer):
    """SFTTrainer-lite: no weight decay on norms and biases."""

    def create_optimizer(self):
        if self.optimizer is None:
            decay, no_decay = [], []
            for name, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": self.args.weight_decay},
                 {"params": no_decay, "weight_decay": 0.0}],
                lr=self.args.learning_rate, betas=(0.9, 0.95))
        return self.optimizer


def main():
    parser = HfArgumentParser((ScriptArgs, TrainingArguments))
    sargs, targs = parser.parse_dict(RUN_CONFIG, allow_extra_keys=True)

    torch.manual_seed(targs.seed)
    cfg = LlamaConfig(vocab_size=sargs.vocab_size, hidden_size=sargs.hidden_size,
                      intermediate_size=2 * sargs.hidden_size, num_hidden_layers=sargs.num_layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, tie_word_embeddings=False,
                      initializer_range=sargs.init_std)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)

    trainer = CompletionOnlyTrainer(model=model, args=targs,
                                    train_dataset=PromptCompletionData(sargs, seed=targs.seed),
                                    data_collator=collate)
    trainer.train()

    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        flat = []
        for _, p in trainer.model.named_parameters():
            t = p.detach().float().cpu().contiguous()
            h.update(t.numpy().tobytes())
            flat.append(t.reshape(-1))
        if os.environ.get("PARAM_DUMP"):
            torch.save(torch.cat(flat), os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
