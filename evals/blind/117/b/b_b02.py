"""LoRA SFT with Accelerate: checkpoint with save_state, crash, resume into fresh objects."""
import argparse
import hashlib
import os
import shutil

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

torch.use_deterministic_algorithms(True)

p = argparse.ArgumentParser()
p.add_argument("--grad_accum", type=int, default=2)
p.add_argument("--batch_size", type=int, default=2)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--lr", type=float, default=2e-3)
p.add_argument("--crash_at_step", type=int, default=5)  # simulate preemption after this many optimizer steps
p.add_argument("--ckpt_dir", default=os.path.join("tmp_scratch", os.path.basename(__file__)[:-3] + "_ckpt"))
args = p.parse_args()


def build(accelerator, n_steps):
    set_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            lora_dropout=0.0, init_lora_weights="gaussian"))
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=args.lr, weight_decay=0.0)
    sched = get_linear_schedule_with_warmup(opt, 2, n_steps * accelerator.num_processes)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (64, 16), generator=g)
    dl = DataLoader(TensorDataset(ids), batch_size=args.batch_size, shuffle=False)
    return accelerator.prepare(model, opt, dl, sched)


def train_epochs(accelerator, model, opt, dl_full, sched, start_epoch, skip, completed, stop_at=None):
    for epoch in range(start_epoch, args.epochs):
        model.train()
        dl = accelerator.skip_first_batches(dl_full, skip) if (epoch == start_epoch and skip) else dl_full
        for (ids,) in dl:
            with accelerator.accumulate(model):
                loss = model(input_ids=ids, labels=ids).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                completed += 1
                if stop_at is not None and completed == stop_at:
                    accelerator.save_state(os.path.join(args.ckpt_dir, f"step_{completed}"))
                    return completed
    return completed


def main():
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, cpu=True)
    if accelerator.is_main_process and os.path.exists(args.ckpt_dir):
        shutil.rmtree(args.ckpt_dir)
    accelerator.wait_for_everyone()
    probe = DataLoader(range(64), batch_size=args.batch_size)
    steps_per_epoch = len(probe) // accelerator.num_processes // args.grad_accum
    n_steps = steps_per_epoch * args.epochs

    model, opt, dl, sched = build(accelerator, n_steps)
    done = train_epochs(accelerator, model, opt, dl, sched, 0, 0, 0, stop_at=args.crash_at_step)
    if done == n_steps:  # never preempted
        return finish(accelerator, model)
    del model, opt, dl, sched
    accelerator.free_memory()

    # ---- resume: fresh objects, state from the latest checkpoint ----
    model, opt, dl, sched = build(accelerator, n_steps)
    ckpt = sorted(os.listdir(args.ckpt_dir), key=lambda s: int(s.split("_")[1]))[-1]
    accelerator.load_state(os.path.join(args.ckpt_dir, ckpt))
    completed_steps = int(ckpt.replace("step_", ""))
    starting_epoch = completed_steps // steps_per_epoch
    resume_step = completed_steps - starting_epoch * steps_per_epoch
    train_epochs(accelerator, model, opt, dl, sched, starting_epoch, resume_step, completed_steps)

    finish(accelerator, model)


def finish(accelerator, model):
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        m = accelerator.unwrap_model(model)
        flat = torch.cat([q.detach().float().reshape(-1) for _, q in m.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
