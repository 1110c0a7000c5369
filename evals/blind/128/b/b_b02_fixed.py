"""Causal-LM pre-training of a tiny GPT-2 with Accelerate, adapted from run_clm_no_trainer.

The global batch is fixed (split_batches=True: every prepared batch is cut across the ranks),
accumulated over GRAD_ACCUM micro-batches, with a linear warm-up/decay schedule.
"""
import argparse
import hashlib
import math
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--global_batch_size", type=int, default=8)       # cut into 4 + 4 rows
    p.add_argument("--gradient_accumulation_steps", type=int, default=3)
    p.add_argument("--num_train_epochs", type=int, default=2)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--num_warmup_steps", type=int, default=2)
    p.add_argument("--n_sequences", type=int, default=192)
    p.add_argument("--block_size", type=int, default=16)
    return p.parse_args()


def make_corpus(args):
    g = torch.Generator().manual_seed(args.seed)
    # a noisy "next = prev + 1 mod V" language so the model has something to learn
    start = torch.randint(0, 64, (args.n_sequences, 1), generator=g)
    seq = (start + torch.arange(args.block_size)) % 64
    noise = torch.rand(seq.shape, generator=g) < 0.15
    seq = torch.where(noise, torch.randint(0, 64, seq.shape, generator=g), seq)
    return TensorDataset(seq)


def main():
    args = parse_args()
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True),
                              gradient_accumulation_steps=args.gradient_accumulation_steps)
    assert accelerator.num_processes == 2
    set_seed(args.seed)

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    train_dataloader = DataLoader(make_corpus(args), batch_size=args.global_batch_size, shuffle=True,
                                  generator=torch.Generator().manual_seed(args.seed))
    no_decay = ["bias", "ln_"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate)

    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)

    # Scheduler and math around the number of training steps (after prepare: the loader may have shrunk).
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(
        "linear", optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=max_train_steps,
    )
    lr_scheduler = accelerator.prepare(lr_scheduler)

    completed = 0
    for epoch in range(args.num_train_epochs):
        model.train()
        for (input_ids,) in train_dataloader:
            with accelerator.accumulate(model):
                loss = model(input_ids=input_ids, labels=input_ids).loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed += 1
        accelerator.print(f"epoch {epoch} steps {completed} lr {lr_scheduler.get_last_lr()[0]:.2e} loss {loss.item():.4f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        final = accelerator.unwrap_model(model)
        for _, p in final.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("B128_DUMP"):
            torch.save({n: p.detach().float().clone() for n, p in final.named_parameters()}, os.environ["B128_DUMP"])
    accelerator.end_training()


if __name__ == "__main__":
    main()
