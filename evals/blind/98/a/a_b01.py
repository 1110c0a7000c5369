"""LoRA fine-tune of a tiny Llama with Accelerate (gradient accumulation via Accelerator).

Launch: torchrun --nproc-per-node 2 a_b01.py
"""
import hashlib
import os
import sys
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup


@dataclass
class TrainConfig:
    seed: int = 1234
    vocab: int = 96
    seq_len: int = 20
    prompt_len: int = 6
    micro_batch: int = 4
    grad_accum: int = 4
    num_updates: int = 6
    lr: float = 2e-3
    warmup: int = 2
    lora_r: int = 8
    log_every: int = 2


class SyntheticSFT(Dataset):
    def __init__(self, n, cfg):
        g = torch.Generator().manual_seed(cfg.seed + 7)
        self.ids = torch.randint(3, cfg.vocab, (n, cfg.seq_len), generator=g)
        self.prompt_len = cfg.prompt_len

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: self.prompt_len] = -100  # train on the completion only
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


class RunLogger:
    """Small wrapper so rank-0-only logging does not need the accelerator passed around."""

    def __init__(self, every):
        self.acc = Accelerator()
        self.every = every
        self.history = []

    def log(self, update, loss):
        self.history.append(loss)
        if self.acc.is_main_process and update % self.every == 0:
            print(f"update {update} loss {loss:.4f}", file=sys.stderr)


def build_model(cfg):
    mcfg = LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.0, tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(mcfg)
    lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(base, lcfg)
    # LoRA B starts at zero; give it a small random start so every adapter moves from step 1
    g = torch.Generator().manual_seed(cfg.seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TrainConfig()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    set_seed(cfg.seed)

    model = build_model(cfg)
    n_samples = cfg.num_updates * cfg.grad_accum * cfg.micro_batch * accelerator.num_processes
    loader = DataLoader(SyntheticSFT(n_samples, cfg), batch_size=cfg.micro_batch, shuffle=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=cfg.lr, weight_decay=0.0)
    # prepared schedulers advance num_processes times per optimizer step
    scheduler = get_linear_schedule_with_warmup(
        optimizer, cfg.warmup * accelerator.num_processes, cfg.num_updates * accelerator.num_processes)

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    logger = RunLogger(cfg.log_every)

    model.train()
    update = 0
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            update += 1
            logger.log(update, loss.item())

    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if os.environ.get("PARAM_DUMP") and accelerator.is_main_process:
        torch.save({n: p.detach().clone() for n, p in unwrapped.named_parameters()}, os.environ["PARAM_DUMP"])
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {params_sha256(unwrapped)}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
