"""LoRA SFT on a tiny Llama with Accelerate (no_trainer-style recipe)."""
import argparse
import hashlib
import math
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_scheduler


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, default=4)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--num_train_epochs", type=int, default=2)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--num_warmup_steps", type=int, default=2)
    p.add_argument("--lr_scheduler_type", default="linear")
    p.add_argument("--max_train_steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def build_data(n=160, seq=16, vocab=128, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq), generator=g)
    labels = ids.clone()
    labels[:, :6] = -100  # prompt tokens are not trained on
    return TensorDataset(ids, labels)


def main():
    args = parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    assert accelerator.num_processes == 2
    set_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    cfg = LlamaConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "o_proj"]))

    train_dataloader = DataLoader(build_data(), batch_size=args.per_device_train_batch_size, shuffle=True,
                                  generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)

    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)

    # Scheduler and math around the number of training steps.
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    lr_scheduler = get_scheduler(
        name=args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
        num_training_steps=args.max_train_steps * accelerator.num_processes,
    )
    lr_scheduler = accelerator.prepare(lr_scheduler)

    model.train()
    for epoch in range(args.num_train_epochs):
        for input_ids, labels in train_dataloader:
            with accelerator.accumulate(model):
                loss = model(input_ids=input_ids, labels=labels).loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        m = accelerator.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        torch.save({n: p.detach().clone() for n, p in m.named_parameters()},
                   f"tmp_scratch/{os.path.splitext(os.path.basename(__file__))[0]}.pt")
    accelerator.end_training()


if __name__ == "__main__":
    main()
