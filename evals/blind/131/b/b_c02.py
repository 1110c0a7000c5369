"""LoRA fine-tuning under Accelerate (K = 2), interrupted after 4 optimizer steps and
resumed from `save_state` into a brand-new model, optimizer, scheduler and loader."""
import argparse
import hashlib
import os
import shutil

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup

K, MB, N, SEQ, VOCAB, EPOCHS = 2, 2, 80, 16, 60, 2
CKPT = "tmp_scratch/c02_ckpt"


def data():
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(3, VOCAB, (N, SEQ), generator=g)
    ids[:, 2::3] = (ids[:, 0::3][:, : ids[:, 2::3].size(1)] + 5) % VOCAB
    return TensorDataset(ids)


def build(acc):
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                             target_modules=["q_proj", "k_proj", "down_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.01)
    updates = EPOCHS * N // (MB * K * acc.num_processes)
    # a prepared scheduler advances once per process at every optimizer step
    sched = get_cosine_schedule_with_warmup(opt, 2 * acc.num_processes, updates * acc.num_processes)
    dl = DataLoader(data(), batch_size=MB, shuffle=False)
    return acc.prepare(model, opt, dl, sched)


def run(acc, model, opt, dl, sched, start_update, stop_update):
    """Train from optimizer update `start_update` until `stop_update` (exclusive)."""
    per_epoch = len(dl) // K
    update = start_update
    for epoch in range(start_update // per_epoch, EPOCHS):
        skip = (update - epoch * per_epoch) * K
        loader = acc.skip_first_batches(dl, skip) if skip else dl
        for (ids,) in loader:
            with acc.accumulate(model):
                out = model(input_ids=ids, labels=ids)
                acc.backward(out.loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 0.8)
                opt.step()
                sched.step()
                opt.zero_grad()
            if acc.sync_gradients:
                update += 1
                if update == stop_update:
                    return update
    return update


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--interrupt-at", type=int, default=4)
    a = ap.parse_args()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=K)
    assert acc.num_processes == 2
    set_seed(5)
    model, opt, dl, sched = build(acc)
    total = EPOCHS * (len(dl) // K)
    done = run(acc, model, opt, dl, sched, 0, a.interrupt_at if a.interrupt_at > 0 else -1)
    if done < total:
        acc.save_state(CKPT)
        acc.wait_for_everyone()
        del model, opt, dl, sched
        acc.free_memory()
        # a fresh process would start here: rebuild everything and load the state
        model, opt, dl, sched = build(acc)
        acc.load_state(CKPT)
        done = run(acc, model, opt, dl, sched, done, -1)
    assert done == total, (done, total)
    if acc.is_main_process:
        print("updates", done)
        print("FINAL_SHA256", final_sha(acc.unwrap_model(model)), flush=True)
        shutil.rmtree(CKPT, ignore_errors=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
