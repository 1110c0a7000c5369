"""LoRA SFT of a tiny Mistral with Accelerate, interrupted after the first epoch and resumed
into freshly built objects (new Accelerator, model, optimizer, scheduler, loader) via
save_state / load_state. Linear warm-up/decay sized in optimizer updates x processes (the
prepared scheduler advances once per process at each update). Clipping at 0.12 on sync steps.
"""
import hashlib
import os
import shutil

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import MistralConfig, MistralForCausalLM, get_linear_schedule_with_warmup

SEED = 5
VOCAB = 96
SEQ = 12
N = 64              # 32 per rank -> 8 micro-batches of 4 per epoch
MICRO = 4
K = 4
EPOCHS = 3
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c02_ckpt")


def make_objects():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
    assert accelerator.num_processes == 2
    set_seed(SEED)
    base = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, max_position_embeddings=64,
                                            sliding_window=None))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "up_proj"],
                                            task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, VOCAB, (N, SEQ), generator=g)
    loader = DataLoader(TensorDataset(ids), batch_size=MICRO, shuffle=False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-3,
                            weight_decay=0.0)
    updates = EPOCHS * (len(loader) // (accelerator.num_processes * K))
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1 * accelerator.num_processes,
                                            num_training_steps=updates * accelerator.num_processes)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    return accelerator, model, opt, loader, sched


def run_epoch(accelerator, model, opt, loader, sched):
    model.train()
    for (ids,) in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 0.12)
            opt.step()
            sched.step()
            opt.zero_grad()


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    acc, model, opt, loader, sched = make_objects()
    run_epoch(acc, model, opt, loader, sched)
    acc.wait_for_everyone()
    acc.save_state(CKPT)
    acc.wait_for_everyone()
    del acc, model, opt, loader, sched

    acc, model, opt, loader, sched = make_objects()
    acc.load_state(CKPT)
    for _ in range(1, EPOCHS):
        run_epoch(acc, model, opt, loader, sched)

    if acc.is_main_process:
        print(f"FINAL_SHA256 {param_sha(acc.unwrap_model(model))}", flush=True)
        shutil.rmtree(CKPT, ignore_errors=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
