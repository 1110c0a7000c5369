# LoRA fine-tune of a small GPT-2 with Accelerate; accumulation via Accelerator(gradient_accumulation_steps)
import hashlib
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup


@dataclass
class Cfg:
    seed: int = 1234
    grad_accum: int = 4
    micro_bs: int = 4
    seq_len: int = 16
    vocab: int = 96
    n_updates: int = 8
    lr: float = 5e-3
    max_norm: float = 1.0
    warmup: int = 2


class ToyCorpus(Dataset):
    def __init__(self, n, seq_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        ids = self.x[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def build_model(cfg):
    mcfg = GPT2Config(vocab_size=cfg.vocab, n_positions=cfg.seq_len, n_embd=32, n_layer=2, n_head=2,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    base = GPT2LMHeadModel(mcfg)
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], lora_dropout=0.0,
                      fan_in_fan_out=True, init_lora_weights="gaussian")
    return get_peft_model(base, lcfg)


def param_digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Cfg()
    accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=True)
    set_seed(cfg.seed)
    model = build_model(cfg)
    n = accelerator.num_processes * cfg.micro_bs * cfg.grad_accum * cfg.n_updates
    loader = DataLoader(ToyCorpus(n, cfg.seq_len, cfg.vocab, cfg.seed), batch_size=cfg.micro_bs, shuffle=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, cfg.warmup * accelerator.num_processes,
                                                cfg.n_updates * accelerator.num_processes)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_norm)
            optimizer.step()
            scheduler.step()
            model.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("FINAL_SHA256", param_digest(accelerator.unwrap_model(model)))


if __name__ == "__main__":
    main()
