#!/usr/bin/env python
"""Answer-only SFT of a LoRA adapter on Accelerate (DDP), windows read ahead.

The model's own loss is used: transformers' causal-LM loss sums the token losses
and divides by `num_items_in_batch` when it is given, so the loss is normalised
by token count instead of a per-batch mean.
"""
import argparse
import hashlib
import os

import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--micro_batch", type=int, default=2)
    p.add_argument("--grad_accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--n_examples", type=int, default=32)
    p.add_argument("--seq_len", type=int, default=16)
    return p.parse_args()


def make_data(args, vocab):
    """Prompts of 3..9 tokens then an answer up to seq_len; only the answer is trained."""
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, vocab, (args.n_examples, args.seq_len), generator=g)
    labels = ids.clone()
    mask = torch.ones_like(ids)
    for i in range(args.n_examples):
        plen = int(torch.randint(3, 10, (1,), generator=g))
        alen = int(torch.randint(2, args.seq_len - plen + 1, (1,), generator=g))
        labels[i, :plen] = -100
        labels[i, plen + alen:] = -100
        ids[i, plen + alen:] = 0
        mask[i, plen + alen:] = 0
    return TensorDataset(ids, mask, labels)


def n_targets(labels):
    return (labels[:, 1:] != -100).sum()


def main():
    args = parse_args()
    torch.use_deterministic_algorithms(True)
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=args.grad_accum,
                                                                sync_with_dataloader=False),
    )
    set_seed(args.seed)
    cfg = LlamaConfig(vocab_size=72, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"],
        init_lora_weights="gaussian"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    loader = DataLoader(make_data(args, cfg.vocab_size), batch_size=args.micro_batch, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    K = args.grad_accum
    for epoch in range(args.epochs):
        model.train()
        batches = iter(loader)
        for _ in range(len(loader) // K):
            window = [next(batches) for _ in range(K)]
            window_targets = accelerator.reduce(sum(n_targets(l) for _, _, l in window), reduction="sum")
            for ids, mask, labels in window:
                with accelerator.accumulate(model):
                    out = model(input_ids=ids, attention_mask=mask, labels=labels,
                                num_items_in_batch=window_targets)
                    accelerator.backward(out.loss * K * accelerator.num_processes)
                    optimizer.step()
                    optimizer.zero_grad()
    accelerator.wait_for_everyone()

    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in unwrapped.named_parameters()])
        if os.environ.get("DUMP_PARAMS"):
            torch.save(flat, os.environ["DUMP_PARAMS"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
