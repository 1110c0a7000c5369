"""Sequence classification with Accelerate, preempted mid-epoch and resumed.

Phase 1 trains until a checkpoint (taken at an accumulation boundary) and "dies"; phase 2
rebuilds model, optimizer and scheduler from scratch, restores them with load_state, skips
the micro-batches already consumed in the epoch, and finishes the run. The scheduler is
prepared, so it advances num_processes times per optimizer step and its horizon is sized
accordingly; the clip runs only on the synchronising micro-step.

accelerate launch --num_processes 2 --main_process_port 34009 a_c03.py
"""
import hashlib
import shutil

import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

SEED = 99
ACCUM = 3
MICRO_BS = 4
EPOCHS = 2
PER_RANK_BATCHES = 12          # 4 windows per epoch per rank
PREEMPT_AFTER_UPDATES = 6      # mid-way through epoch 2
CKPT = "_ckpt_a_c03"


def make_data():
    g = torch.Generator().manual_seed(SEED)
    n = 2 * PER_RANK_BATCHES * MICRO_BS
    ids = torch.randint(5, 200, (n, 12), generator=g)
    lens = torch.randint(4, 13, (n,), generator=g)
    mask = (torch.arange(12)[None] < lens[:, None]).long()
    ids = ids * mask
    labels = (ids[:, 0] + lens) % 3
    perm = torch.randperm(n, generator=g)
    return TensorDataset(ids[perm], mask[perm], labels[perm])


def build(accelerator, loader):
    set_seed(SEED)
    cfg = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16, num_labels=3,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    updates = EPOCHS * PER_RANK_BATCHES // ACCUM
    n = accelerator.num_processes
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2 * n, num_training_steps=updates * n)
    return accelerator.prepare(model, opt, sched, loader)


def train(accelerator, model, opt, sched, loader, start_update, stop_update):
    update = start_update
    per_epoch = len(loader) // ACCUM
    model.train()
    while update < stop_update:
        epoch, done_in_epoch = divmod(update, per_epoch)
        it = accelerator.skip_first_batches(loader, done_in_epoch * ACCUM) if done_in_epoch else loader
        for ids, mask, y in it:
            with accelerator.accumulate(model):
                out = model(input_ids=ids, attention_mask=mask, labels=y)
                accelerator.backward(out.loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                sched.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                update += 1
                if update == stop_update:
                    return update
    return update


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    accelerator = Accelerator(gradient_accumulation_steps=ACCUM)
    loader = DataLoader(make_data(), batch_size=MICRO_BS, shuffle=False)
    total = EPOCHS * PER_RANK_BATCHES // ACCUM

    # phase 1: train, checkpoint at a boundary, then lose everything
    model, opt, sched, dl = build(accelerator, loader)
    done = train(accelerator, model, opt, sched, dl, 0, PREEMPT_AFTER_UPDATES)
    if accelerator.is_main_process:
        shutil.rmtree(CKPT, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(CKPT)
    accelerator.wait_for_everyone()
    model, opt, sched, dl = accelerator.free_memory(model, opt, sched, dl)

    # phase 2: fresh objects, restored state
    model, opt, sched, dl = build(accelerator, loader)
    accelerator.load_state(CKPT)
    train(accelerator, model, opt, sched, dl, done, total)

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {params_sha(accelerator.unwrap_model(model))}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
