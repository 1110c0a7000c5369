"""Completion-only SFT of a LoRA adapter with Accelerate, resumable from
`accelerator.save_state` checkpoints (structure follows run_clm_no_trainer.py).

The run is preempted after `PREEMPT_AT` optimizer steps and restarted from the
last `step_N` checkpoint, exactly as a cluster job would be.
"""
import hashlib
import math
import os
import shutil
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import LlamaConfig, LlamaForCausalLM, get_scheduler
from peft import LoraConfig, get_peft_model


@dataclass
class Args:
    seed: int = 1234
    per_device_train_batch_size: int = 2
    gradient_accumulation_steps: int = 4
    num_train_epochs: int = 3
    learning_rate: float = 3e-3
    lr_scheduler_type: str = "linear"
    num_warmup_steps: int = 2
    checkpointing_steps: int = 4
    preempt_at: int = 5
    n_samples: int = 40
    prompt_len: int = 4
    completion_len: int = 8
    output_dir: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_b01_fixed_ckpt")


class PromptCompletion(Dataset):
    def __init__(self, n, plen, clen, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, plen + clen), generator=g)
        self.plen = plen

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: self.plen] = -100
        return {"input_ids": ids, "labels": labels}


def build_model(seed):
    set_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = LlamaForCausalLM(cfg)
    lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                      init_lora_weights="gaussian")
    return get_peft_model(base, lcfg)


def train(args, resume_from_checkpoint=None, stop_after=None):
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, cpu=True)
    model = build_model(args.seed)
    ds = PromptCompletion(args.n_samples, args.prompt_len, args.completion_len, 96, args.seed)
    train_dataloader = DataLoader(ds, batch_size=args.per_device_train_batch_size, shuffle=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=0.0)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.num_processes
                                           / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler(args.lr_scheduler_type, optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=max_train_steps * accelerator.num_processes)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)

    K = args.gradient_accumulation_steps
    completed_steps = 0
    starting_epoch = 0
    resume_step = None
    if resume_from_checkpoint is not None:
        accelerator.load_state(resume_from_checkpoint)
        training_difference = os.path.basename(resume_from_checkpoint.rstrip("/"))
        # windows restart every epoch (the last one may be short): count in updates
        completed_steps = int(training_difference.replace("step_", ""))
        updates_per_epoch = math.ceil(len(train_dataloader) / K)
        starting_epoch = completed_steps // updates_per_epoch
        resume_step = (completed_steps - starting_epoch * updates_per_epoch) * K

    n_batches = len(train_dataloader)
    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        offset = 0
        if resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
            offset = resume_step
        else:
            active_dataloader = train_dataloader
        for step, batch in enumerate(active_dataloader):
            pos = offset + step
            # the epoch's last window may be short: weight so that every window is a mean
            in_window = min(K, n_batches - (pos // K) * K)
            with accelerator.accumulate(model):
                out = model(input_ids=batch["input_ids"], labels=batch["labels"])
                accelerator.backward(out.loss * K / in_window)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                if completed_steps % args.checkpointing_steps == 0:
                    accelerator.save_state(os.path.join(args.output_dir, f"step_{completed_steps}"))
                if stop_after is not None and completed_steps >= stop_after:
                    accelerator.wait_for_everyone()
                    return None
            if completed_steps >= max_train_steps:
                break
    accelerator.wait_for_everyone()
    return accelerator, accelerator.unwrap_model(model)


def main():
    args = Args()
    torch.use_deterministic_algorithms(True)
    if int(os.environ.get("RANK", "0")) == 0 and os.path.isdir(args.output_dir):
        shutil.rmtree(args.output_dir)
    # first attempt: the job is preempted after `preempt_at` updates
    train(args, stop_after=args.preempt_at)
    ckpts = sorted(d for d in os.listdir(args.output_dir) if d.startswith("step_"))
    last = os.path.join(args.output_dir, ckpts[-1])
    accelerator, model = train(args, resume_from_checkpoint=last)
    if accelerator.is_main_process:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        if os.environ.get("DUMP_PARAMS"):
            torch.save(flat, os.environ["DUMP_PARAMS"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    accelerator.end_training()


if __name__ == "__main__":
    main()
