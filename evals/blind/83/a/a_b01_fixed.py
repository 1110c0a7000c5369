"""LoRA fine-tune of a small causal LM with Accelerate gradient accumulation.

Launch: accelerate launch --num_processes 2 --main_process_port 34002 a_b01_fixed.py
"""
import hashlib
import math
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup


@dataclass
class TrainConfig:
    vocab_size: int = 128
    seq_len: int = 24
    micro_batch_size: int = 4
    grad_accum: int = 4
    num_epochs: int = 2
    lr: float = 3e-3
    warmup_steps: int = 2
    seed: int = 1234


class SyntheticLM(Dataset):
    def __init__(self, n, seq_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(3, vocab, (n, seq_len), generator=g)
        # a learnable pattern: every odd token copies the previous one + 1
        base[:, 1::2] = (base[:, 0::2] + 1) % vocab
        self.ids = base

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        x = self.ids[i]
        return {"input_ids": x, "labels": x.clone()}


def build_model(cfg):
    mcfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64)
    base = LlamaForCausalLM(mcfg)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TrainConfig()
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum)
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    model = build_model(cfg)
    ds = SyntheticLM(2 * cfg.micro_batch_size * cfg.grad_accum * 3, cfg.seq_len, cfg.vocab_size, cfg.seed)
    loader = DataLoader(ds, batch_size=cfg.micro_batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=cfg.lr, weight_decay=0.01)

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    # The scheduler stays outside prepare(): a prepared scheduler is stepped once per process,
    # and we want it to follow our own count of optimizer updates.
    updates_per_epoch = math.ceil(len(loader) / cfg.grad_accum)
    total_updates = updates_per_epoch * cfg.num_epochs
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, cfg.warmup_steps, total_updates)

    model.train()
    for epoch in range(cfg.num_epochs):
        for batch in loader:
            with accelerator.accumulate(model):
                out = model(**batch)
                accelerator.backward(out.loss)
                optimizer.step()
                if accelerator.sync_gradients:
                    lr_scheduler.step()
                optimizer.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {params_sha(accelerator.unwrap_model(model))}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
