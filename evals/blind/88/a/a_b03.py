"""LoRA fine-tuning of a tiny Llama with Accelerate on 2 processes.

Completion-only SFT: prompts are masked, completions have different lengths. The objective of
one update is the mean cross-entropy over every completion token the update sees (all
micro-batches, all ranks). Each window of `grad_accum` micro-batches is read ahead so that its
token count can be logged.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class TrainConfig:
    seed: int = 11
    vocab: int = 128
    max_len: int = 24
    n_examples: int = 192
    micro_bs: int = 4
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 2e-2
    lora_r: int = 8


def build_examples(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for _ in range(cfg.n_examples):
        p_len = int(torch.randint(3, 8, (1,), generator=g))
        c_len = int(torch.randint(1, cfg.max_len - p_len + 1, (1,), generator=g))
        ids = torch.randint(2, cfg.vocab, (p_len + c_len,), generator=g)
        rows.append((ids, p_len))
    return rows


def collate(rows, max_len=24):
    ids = torch.zeros(len(rows), max_len, dtype=torch.long)
    att = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (seq, p_len) in enumerate(rows):
        n = len(seq)
        ids[i, :n], att[i, :n] = seq, 1
        labels[i, p_len:n] = seq[p_len:]
    return {"input_ids": ids, "attention_mask": att, "labels": labels}


def windows(loader, k):
    it = iter(loader)
    while True:
        win = []
        for _ in range(k):
            b = next(it, None)
            if b is None:
                return
            win.append(b)
        yield win


def main():
    cfg = TrainConfig()
    plugin = GradientAccumulationPlugin(num_steps=cfg.grad_accum, sync_with_dataloader=False)
    accelerator = Accelerator(gradient_accumulation_plugin=plugin, cpu=True)
    set_seed(cfg.seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=cfg.max_len, initializer_range=0.1))
    model = get_peft_model(base, LoraConfig(r=cfg.lora_r, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    loader = DataLoader(build_examples(cfg), batch_size=cfg.micro_bs, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(cfg.seed))
    model, opt, loader = accelerator.prepare(model, opt, loader)
    W, K = accelerator.num_processes, cfg.grad_accum

    model.train()
    for epoch in range(cfg.epochs):
        for win in windows(loader, K):
            n_win = sum((b["labels"][:, 1:] != -100).sum() for b in win)
            n_win = accelerator.reduce(n_win, reduction="sum").item()  # completion tokens in this update
            for batch in win:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    opt.step()
                    opt.zero_grad()
            if accelerator.is_main_process and epoch == 0:
                print(f"tokens/update {n_win}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        net = accelerator.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in net.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        if os.environ.get("DUMP_DIR"):
            torch.save(flat, os.path.join(os.environ["DUMP_DIR"], os.path.basename(__file__) + ".pt"))


if __name__ == "__main__":
    main()
