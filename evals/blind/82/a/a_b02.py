#!/usr/bin/env python
"""LoRA continued-pretraining of a small Llama with Accelerate + PEFT.

    accelerate launch --multi_gpu --num_processes 2 a_b02.py

Sequences are fixed-length packed chunks (no padding), so every micro-batch carries the
same number of target tokens and the model's token mean is the right per-batch loss.
"""
import argparse
import hashlib

import torch
from torch.utils.data import DataLoader, TensorDataset

from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--vocab_size", type=int, default=128)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--num_chunks", type=int, default=128)
    p.add_argument("--per_device_batch_size", type=int, default=4)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--num_epochs", type=int, default=3)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--max_grad_norm", type=float, default=0.1)
    p.add_argument("--lora_r", type=int, default=8)
    return p.parse_args()


def make_chunks(args):
    """Packed 'documents': noisy arithmetic progressions mod vocab."""
    g = torch.Generator().manual_seed(args.seed)
    start = torch.randint(0, args.vocab_size, (args.num_chunks, 1), generator=g)
    stride = torch.randint(1, 6, (args.num_chunks, 1), generator=g)
    ar = torch.arange(args.block_size).unsqueeze(0)
    ids = (start + stride * ar) % args.vocab_size
    noise = torch.rand(ids.shape, generator=g) < 0.1
    ids = torch.where(noise, torch.randint(0, args.vocab_size, ids.shape, generator=g), ids)
    return TensorDataset(ids)


def build_model(args):
    cfg = LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.block_size,
        tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, lora)


def sha_of_params(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=True)
    set_seed(args.seed)

    model = build_model(args)
    loader = DataLoader(make_chunks(args), batch_size=args.per_device_batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=args.learning_rate, weight_decay=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    for epoch in range(args.num_epochs):
        running = 0.0
        for (ids,) in loader:
            with accelerator.accumulate(model):
                out = model(input_ids=ids, labels=ids)
                accelerator.backward(out.loss)
                accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            running += out.loss.item()
        accelerator.print(f"epoch {epoch} loss {running / len(loader):.4f}")

    accelerator.wait_for_everyone()
    final = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {sha_of_params(final)}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
