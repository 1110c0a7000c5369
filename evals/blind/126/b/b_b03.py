"""Accelerate + PEFT LoRA SFT with a token-level loss (accelerate's recipe).

Launch with torchrun, two CPU processes.
"""
import argparse
import hashlib
import random

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--vocab", type=int, default=80)
    p.add_argument("--n-examples", type=int, default=64)
    p.add_argument("--per-device-batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-2)
    return p.parse_args()


def make_data(n, vocab, seed):
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        prompt = [rng.randint(1, vocab - 1) for _ in range(rng.randint(2, 10))]
        answer = [rng.randint(1, vocab - 1) for _ in range(rng.choice([1, 2, 3, 12, 16]))]
        data.append((prompt, answer))
    return data


def collate(batch):
    width = max(len(p) + len(a) for p, a in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(batch):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(p) : len(seq)] = torch.tensor(a)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def n_target_tokens(batch):
    return batch["labels"][:, 1:].ne(-100).sum()


def summed_token_loss(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].float()
    target = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                           ignore_index=-100, reduction="sum")


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    args = parse_args()
    plugin = GradientAccumulationPlugin(num_steps=args.grad_accum, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    assert accelerator.num_processes == 2
    set_seed(args.seed)

    base = LlamaForCausalLM(LlamaConfig(
        vocab_size=args.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    ))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "up_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(make_data(args.n_examples, args.vocab, args.seed), batch_size=args.per_device_batch,
                        shuffle=True, generator=g, collate_fn=collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for window in windows(loader, args.grad_accum):
            for batch in window:
                with accelerator.accumulate(model):
                    # number of target tokens this step covers, over all processes
                    n_tok = accelerator.gather(n_target_tokens(batch)).sum()
                    loss = summed_token_loss(model, batch) / n_tok
                    # DDP averages over processes: undo it so the loss is a true token mean
                    loss = loss * accelerator.num_processes
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in unwrapped.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
