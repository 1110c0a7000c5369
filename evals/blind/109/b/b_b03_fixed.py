#!/usr/bin/env python
"""Causal LM pre-training, `run_clm_no_trainer`-style, Accelerate + DeepSpeed ZeRO-1.

The LR schedule is DeepSpeed's own WarmupDecayLR so that the engine owns it
(warm-up then linear decay over the run's optimizer steps).
"""
import argparse
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs, set_seed
from deepspeed.runtime.lr_schedules import WarmupDecayLR


def parse_args():
    parser = argparse.ArgumentParser(description="tiny CLM")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--vocab_size", type=int, default=128)
    parser.add_argument("--block_size", type=int, default=16)
    parser.add_argument("--d_model", type=int, default=48)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=4e-3)
    parser.add_argument("--num_warmup_steps", type=int, default=3)
    parser.add_argument("--max_grad_norm", type=float, default=0.0)
    parser.add_argument("--num_docs", type=int, default=96)
    return parser.parse_args()


class SyntheticCorpus(Dataset):
    def __init__(self, n, block, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 5, (n, 1), generator=g)
        noise = (torch.rand(n, block + 1, generator=g) < 0.1) * torch.randint(0, vocab, (n, block + 1), generator=g)
        self.ids = (start + stride * torch.arange(block + 1) + noise) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i, :-1], "labels": self.ids[i, 1:]}


class TinyCLM(nn.Module):
    def __init__(self, vocab, d, block):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.mix = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        mask = torch.tril(torch.ones(block, block))
        self.register_buffer("causal", mask / mask.sum(-1, keepdim=True), persistent=False)

    def forward(self, input_ids, labels=None):
        T = input_ids.shape[1]
        h = self.wte(input_ids) + self.wpe(torch.arange(T))
        h = h + torch.tanh(self.mix(self.causal[:T, :T] @ h))
        logits = self.lm_head(self.ln(h))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
        return loss, logits


def main():
    args = parse_args()
    ds_config = {
        "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "gradient_clipping": args.max_grad_norm,
        "zero_optimization": {"stage": 1},
        "steps_per_print": 10 ** 9,
    }
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
    )
    set_seed(args.seed)

    train_dataset = SyntheticCorpus(args.num_docs, args.block_size, args.vocab_size, args.seed)
    train_dataloader = DataLoader(train_dataset, shuffle=True, batch_size=args.per_device_train_batch_size)
    model = TinyCLM(args.vocab_size, args.d_model, args.block_size)

    no_decay = ["bias", "ln.weight"]
    grouped = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.05},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(grouped, lr=args.learning_rate)

    # Scheduler and math around the number of training steps.
    num_update_steps_per_epoch = math.ceil(
        len(train_dataloader) / accelerator.num_processes / args.gradient_accumulation_steps
    )
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = WarmupDecayLR(
        optimizer,
        total_num_steps=max_train_steps,
        warmup_min_lr=0.0,
        warmup_max_lr=args.learning_rate,
        warmup_num_steps=args.num_warmup_steps,
        warmup_type="linear",
    )

    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )

    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                loss, _ = model(**batch)
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
        accelerator.print(f"epoch {epoch} steps {completed_steps} loss {loss.item():.4f}")

    unwrapped = accelerator.unwrap_model(model)
    digest = hashlib.sha256()
    for _, p in unwrapped.named_parameters():
        digest.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {digest.hexdigest()}", flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
