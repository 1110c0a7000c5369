"""LoRA instruction tuning of a tiny Llama with Accelerate (no Trainer).

Follows the accelerate `no_trainer` examples: prepared model / optimizer /
dataloader / scheduler, `accelerator.accumulate` for gradient accumulation.
"""
import argparse
import hashlib

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_batch_size", type=int, default=2)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


def build_data(n=64, seq=16, vocab=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    ids[:, 1::2] = (ids[:, 0::2] + 5) % vocab       # learnable pattern
    return TensorDataset(ids)


def build_model():
    cfg = LlamaConfig(vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "gate_proj"], bias="none")
    return get_peft_model(base, lora)


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=True)
    set_seed(args.seed)

    model = build_model()
    train_dl = DataLoader(build_data(), batch_size=args.per_device_batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(args.seed))

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=args.lr, weight_decay=0.0)
    steps_per_epoch = len(train_dl) // accelerator.num_processes // args.gradient_accumulation_steps
    total = steps_per_epoch * args.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup * accelerator.num_processes,
                                                total * accelerator.num_processes)

    model, opt, train_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, scheduler)

    model.train()
    for epoch in range(args.epochs):
        for (ids,) in train_dl:
            with accelerator.accumulate(model):
                out = model(input_ids=ids, labels=ids)
                accelerator.backward(out.loss)
                opt.step()
                scheduler.step()
                opt.zero_grad()
        accelerator.print(f"epoch {epoch} loss {out.loss.item():.4f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
