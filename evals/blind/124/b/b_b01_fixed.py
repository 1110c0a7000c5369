"""LoRA fine-tune of a small Llama with Accelerate, cosine schedule with warm-up.

The schedule is sized in optimizer updates; Accelerate is told not to tie the
scheduler to the optimizer (otherwise it advances it once per process).
"""
import hashlib
import math
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup


@dataclass
class Cfg:
    seed: int = 1234
    vocab: int = 128
    seq_len: int = 16
    n_samples: int = 64
    per_device_bs: int = 2
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 3e-3
    warmup_updates: int = 2


def build_model(cfg):
    mcfg = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64)
    base = LlamaForCausalLM(mcfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def build_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
    return TensorDataset(ids)


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Cfg()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum,
                              step_scheduler_with_optimizer=False)
    assert accelerator.num_processes == 2
    set_seed(cfg.seed)
    model = build_model(cfg)
    loader = DataLoader(build_data(cfg), batch_size=cfg.per_device_bs, shuffle=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=cfg.lr, weight_decay=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    updates_per_epoch = math.ceil(len(loader) / cfg.grad_accum)
    total_updates = updates_per_epoch * cfg.epochs
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, cfg.warmup_updates, total_updates)
    lr_scheduler = accelerator.prepare(lr_scheduler)

    model.train()
    for epoch in range(cfg.epochs):
        for (ids,) in loader:
            with accelerator.accumulate(model):
                out = model(input_ids=ids, labels=ids)
                accelerator.backward(out.loss)
                optimizer.step()
                if accelerator.sync_gradients:
                    lr_scheduler.step()
                optimizer.zero_grad()

    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {param_sha(unwrapped)}", flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
