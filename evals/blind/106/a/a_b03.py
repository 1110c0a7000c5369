"""Soft-prompt + full fine-tuning of a small LM with Accelerate.

A learned prefix of N_PROMPT embeddings is prepended to every sequence; the LM and
the prefix are trained together (prefix at a higher learning rate).
"""
import hashlib
from types import SimpleNamespace

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

CFG = SimpleNamespace(seed=11, vocab=80, seq_len=20, n_prompt=6, rows=192, micro_batch=4,
                      grad_accum=4, epochs=2, lr=1e-3, prompt_lr=1e-2, clip=1.0)


class SoftPrompt(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self.embeds = nn.Parameter(torch.randn(n, dim) * 0.02)

    def forward(self, batch_size):
        return self.embeds.unsqueeze(0).expand(batch_size, -1, -1)


class PromptedLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.lm = GPT2LMHeadModel(GPT2Config(
            vocab_size=cfg.vocab, n_positions=cfg.seq_len + cfg.n_prompt, n_embd=32, n_layer=2,
            n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
            eos_token_id=0))

    def forward(self, ids, prefix):
        tok = self.lm.transformer.wte(ids)
        embeds = torch.cat([prefix, tok], dim=1)
        ignore = torch.full(prefix.shape[:2], -100, dtype=ids.dtype, device=ids.device)
        labels = torch.cat([ignore, ids], dim=1)
        return self.lm(inputs_embeds=embeds, labels=labels).loss


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    a = torch.randint(1, 6, (cfg.rows, 1), generator=g)
    b = torch.randint(0, cfg.vocab, (cfg.rows, 1), generator=g)
    steps = torch.arange(cfg.seq_len).unsqueeze(0)
    return TensorDataset((b + a * steps) % cfg.vocab)


def train(cfg):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    set_seed(cfg.seed)
    model = PromptedLM(cfg)
    prompt = SoftPrompt(cfg.n_prompt, 32)
    optimizer = torch.optim.AdamW([
        {"params": model.parameters(), "lr": cfg.lr},
        {"params": prompt.parameters(), "lr": cfg.prompt_lr},
    ], weight_decay=0.0)
    loader = DataLoader(make_dataset(cfg), batch_size=cfg.micro_batch, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    prompt = prompt.to(accelerator.device)

    model.train()
    for epoch in range(cfg.epochs):
        for (ids,) in loader:
            with accelerator.accumulate(model):
                loss = model(ids, prompt(ids.size(0)))
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(
                        list(model.parameters()) + list(prompt.parameters()), cfg.clip)
                optimizer.step()
                optimizer.zero_grad()
    return accelerator, model, prompt


def main():
    torch.use_deterministic_algorithms(True)
    accelerator, model, prompt = train(CFG)
    accelerator.wait_for_everyone()
    params = list(accelerator.unwrap_model(model).named_parameters()) + \
        list(accelerator.unwrap_model(prompt).named_parameters())
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in params])
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
