"""LoRA SFT of a tiny Llama with Accelerate.

Ported from our plain-PyTorch loop: the loop still gathers a window of micro-batches
itself; Accelerate handles devices, DDP and the gradient-accumulation bookkeeping.
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup

RUN_NAME = os.path.splitext(os.path.basename(__file__))[0]


@dataclass
class TrainConfig:
    vocab_size: int = 256
    seq_len: int = 24
    n_samples: int = 96          # 48 per rank -> 12 micro-batches of 4
    micro_batch: int = 4
    grad_accum: int = 2
    lr: float = 3e-3
    warmup: int = 1
    seed: int = 11
    lora_targets: list = field(default_factory=lambda: ["q_proj", "v_proj", "o_proj"])


def build_model(cfg):
    mcfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False)
    base = LlamaForCausalLM(mcfg)
    lcfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=cfg.lora_targets,
                      init_lora_weights="gaussian")
    return get_peft_model(base, lcfg)


def windows(loader, k):
    buf = []
    for batch in loader:
        buf.append(batch)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    cfg = TrainConfig()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    assert accelerator.num_processes == 2
    set_seed(cfg.seed)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, cfg.vocab_size, (cfg.n_samples, cfg.seq_len), generator=g)
    loader = DataLoader(TensorDataset(ids), batch_size=cfg.micro_batch, shuffle=False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=0.0)
    n_updates = len(loader) // accelerator.num_processes // cfg.grad_accum
    sched = get_cosine_schedule_with_warmup(opt, cfg.warmup * accelerator.num_processes,
                                            n_updates * accelerator.num_processes)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)

    model.train()
    for window in windows(loader, cfg.grad_accum):
        with accelerator.accumulate(model):
            for (x,) in window:
                loss = model(input_ids=x, labels=x).loss
                accelerator.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        net = accelerator.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        torch.save({n: p.detach().float().cpu() for n, p in net.named_parameters()},
                   os.path.join("tmp_scratch", RUN_NAME + ".params.pt"))
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
