"""Accelerate training that is pre-empted and resumed from `save_state`.

A tiny Mistral is trained with two optimizers (AdamW for the body, SGD with
momentum for the untied LM head; the input embedding is frozen).  After
`stop_after` optimizer steps the run checkpoints with `accelerator.save_state`,
throws every object away, rebuilds them, restores with `load_state` and skips
the micro-batches already consumed in the current epoch.
"""
import gc
import hashlib
import os
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import MistralConfig, MistralForCausalLM


@dataclass
class Cfg:
    micro_bs: int = 2
    accum: int = 3
    epochs: int = 2
    body_lr: float = 3e-3
    head_lr: float = 0.05
    stop_after: int = 4          # optimizer steps before the simulated pre-emption
    ckpt: str = "tmp_scratch/b_c02_ckpt"
    seed: int = 5


def dataset(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 90, (72, 14), generator=g)
    x[:, 7:] = (x[:, :7] + 3) % 90
    return TensorDataset(x[torch.randperm(72, generator=g)])


def build(cfg, accelerator):
    set_seed(cfg.seed)
    mcfg = MistralConfig(vocab_size=90, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=False, sliding_window=None)
    model = MistralForCausalLM(mcfg)
    model.model.embed_tokens.weight.requires_grad_(False)
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("lm_head")]
    opt_body = torch.optim.AdamW(body, lr=cfg.body_lr, weight_decay=0.01)
    opt_head = torch.optim.SGD(model.lm_head.parameters(), lr=cfg.head_lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt_body, lambda s: min(1.0, (s + 1) / 4))
    dl = DataLoader(dataset(), batch_size=cfg.micro_bs, shuffle=False)
    return accelerator.prepare(model, opt_body, opt_head, sched, dl)


def run(cfg, accelerator, objs, start_epoch, skip, stop_at=None):
    model, opt_body, opt_head, sched, dl = objs
    step = start_epoch * len(dl) // cfg.accum + skip // cfg.accum
    model.train()
    for epoch in range(start_epoch, cfg.epochs):
        loader = accelerator.skip_first_batches(dl, skip) if (epoch == start_epoch and skip) else dl
        for (ids,) in loader:
            with accelerator.accumulate(model):
                loss = model(input_ids=ids, labels=ids).loss
                accelerator.backward(loss)
                opt_body.step()
                opt_head.step()
                sched.step()
                opt_body.zero_grad()
                opt_head.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                if stop_at is not None and step == stop_at:
                    return epoch, step
    return cfg.epochs, step


def main():
    cfg = Cfg()
    accelerator = Accelerator(gradient_accumulation_steps=cfg.accum, cpu=True)

    objs = build(cfg, accelerator)
    epoch, step = run(cfg, accelerator, objs, 0, 0, stop_at=cfg.stop_after)
    accelerator.save_state(cfg.ckpt)
    accelerator.wait_for_everyone()
    accelerator.print(f"pre-empted at epoch {epoch} step {step}")

    # --- a fresh process would start here: rebuild everything and restore
    accelerator.free_memory()
    del objs
    gc.collect()
    accelerator = Accelerator(gradient_accumulation_steps=cfg.accum, cpu=True)
    objs = build(cfg, accelerator)
    accelerator.load_state(cfg.ckpt)
    per_epoch = len(objs[4]) // cfg.accum
    start_epoch = step // per_epoch
    skip = (step - start_epoch * per_epoch) * cfg.accum
    run(cfg, accelerator, objs, start_epoch, skip)

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(objs[0]).named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
