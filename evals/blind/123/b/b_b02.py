"""Accelerate + PEFT LoRA fine-tuning of a tiny Llama, preemption-safe.

Checkpoints are written with `accelerator.save_state` every few micro-batches; the job is
preempted once (simulated) and resumes from the newest checkpoint in a fresh set of objects.
"""
import argparse
import hashlib
import json
import os
import shutil

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--num_epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-2)
    p.add_argument("--checkpointing_steps", type=int, default=10,
                   help="save accelerator state every N batches")
    p.add_argument("--preempt_at", type=int, default=14,
                   help="simulate a preemption after this many batches of epoch 0")
    p.add_argument("--output_dir", default="tmp_scratch/b_b02_ckpt")
    return p.parse_args()


def make_data(seed, n=96, seq=12, vocab=80):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, vocab, (n, seq), generator=g)
    x[:, 6:] = torch.flip(x[:, :6], dims=[1])  # learnable: second half mirrors the first
    return TensorDataset(x)


def build(args, accelerator):
    set_seed(args.seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=4, max_position_embeddings=32))
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])
    model = get_peft_model(base, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    dl = DataLoader(make_data(args.seed), batch_size=args.batch_size, shuffle=False)
    return accelerator.prepare(model, opt, dl)


def train(args, accelerator, resume_from=None, preempt_at=None):
    model, optimizer, train_dl = build(args, accelerator)
    start_epoch, skip = 0, 0
    if resume_from is not None:
        accelerator.load_state(resume_from)
        with open(os.path.join(resume_from, "progress.json")) as f:
            prog = json.load(f)
        start_epoch, skip = prog["epoch"], prog["batch"]
    for epoch in range(start_epoch, args.num_epochs):
        model.train()
        loader = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        batch_idx = skip
        skip = 0
        for (ids,) in loader:
            with accelerator.accumulate(model):
                out = model(input_ids=ids, labels=ids)
                accelerator.backward(out.loss)
                optimizer.step()
                optimizer.zero_grad()
            batch_idx += 1
            if batch_idx % args.checkpointing_steps == 0:
                ckpt = os.path.join(args.output_dir, f"epoch{epoch}_batch{batch_idx}")
                accelerator.save_state(ckpt)
                if accelerator.is_main_process:
                    with open(os.path.join(ckpt, "progress.json"), "w") as f:
                        json.dump({"epoch": epoch, "batch": batch_idx}, f)
                accelerator.wait_for_everyone()
            if preempt_at is not None and epoch == 0 and batch_idx == preempt_at:
                return None
    return accelerator.unwrap_model(model)


def latest_checkpoint(output_dir):
    cks = [d for d in os.listdir(output_dir) if d.startswith("epoch")]
    cks.sort(key=lambda d: tuple(int(s) for s in d.replace("epoch", "").split("_batch")))
    return os.path.join(output_dir, cks[-1])


def main():
    args = parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    assert accelerator.num_processes == 2, accelerator.num_processes
    if accelerator.is_main_process:
        shutil.rmtree(args.output_dir, ignore_errors=True)
        os.makedirs(args.output_dir)
    accelerator.wait_for_everyone()

    train(args, accelerator, preempt_at=args.preempt_at)  # first job, preempted
    accelerator.free_memory()                              # the "new job"
    accelerator.wait_for_everyone()
    model = train(args, accelerator, resume_from=latest_checkpoint(args.output_dir))

    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
                   f"tmp_scratch/{os.path.splitext(os.path.basename(__file__))[0]}.pt")


if __name__ == "__main__":
    main()
