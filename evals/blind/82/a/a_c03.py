"""Sentiment probe on a LoRA'd tiny GPT-2 with Lightning Fabric; spawns its own 2 CPU ranks.

    python a_c03.py

Two optimizers: AdamW + cosine schedule for the LoRA adapters, SGD with momentum for the
linear head. Every epoch has 7 micro-batches per rank and windows of 3, so each epoch ends
with a one-micro-batch window; the loss is divided by the length of the window it belongs
to. The run is pre-empted after the second window of epoch 1 and resumed from the
checkpoint into freshly built objects.
"""
import hashlib
import math
import os
import shutil
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from lightning_fabric import Fabric, seed_everything
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2Model

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "33011")


class Cfg:
    seed = 314
    vocab = 64
    seq = 12
    micro_bs = 4
    per_rank_batches = 7
    window = 3
    epochs = 3
    lora_lr = 4e-3
    head_lr = 5e-2
    stop_at = (1, 2)          # (epoch, windows done in that epoch) when the job is pre-empted
    ckpt_dir = os.path.join(tempfile.gettempdir(), "a_c03_ckpt")


class Probe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        body = GPT2Model(GPT2Config(vocab_size=cfg.vocab, n_positions=cfg.seq, n_embd=32, n_layer=2, n_head=4,
                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                    bos_token_id=0, eos_token_id=0))
        self.body = get_peft_model(body, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                    target_modules=["c_attn", "c_proj"], fan_in_fan_out=True))
        self.head = nn.Linear(32, 2)

    def forward(self, ids):
        h = self.body(input_ids=ids).last_hidden_state
        return self.head(h.mean(dim=1))


def dataset(cfg, world):
    g = torch.Generator().manual_seed(cfg.seed)
    n = world * cfg.per_rank_batches * cfg.micro_bs
    ids = torch.randint(4, cfg.vocab, (n, cfg.seq), generator=g)
    y = (ids < cfg.vocab // 3).sum(1).gt(cfg.seq // 3).long()
    return TensorDataset(ids, y)


def build(fabric, cfg, init_seed):
    torch.manual_seed(init_seed)
    model = Probe(cfg)
    lora_params = [p for n, p in model.named_parameters() if "lora_" in n]
    opt_lora = torch.optim.AdamW(lora_params, lr=cfg.lora_lr, weight_decay=0.0)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=cfg.head_lr, momentum=0.9)
    total = cfg.epochs * math.ceil(cfg.per_rank_batches / cfg.window)
    sched = torch.optim.lr_scheduler.LambdaLR(opt_lora, lambda s: 0.5 * (1 + math.cos(math.pi * s / total)))
    model, opt_lora, opt_head = fabric.setup(model, opt_lora, opt_head)
    return model, opt_lora, opt_head, sched


def windows(n_batches, k):
    """[(start, length), ...] for one epoch."""
    return [(s, min(k, n_batches - s)) for s in range(0, n_batches, k)]


def run_epochs(fabric, cfg, state, loader, start_epoch, start_window, stop_at=None):
    model, opt_lora, opt_head, sched = state["model"], state["opt_lora"], state["opt_head"], state["sched"]
    for epoch in range(start_epoch, cfg.epochs):
        loader.sampler.set_epoch(epoch)
        batches = list(loader)
        plan = windows(len(batches), cfg.window)
        first = start_window if epoch == start_epoch else 0
        for w_idx in range(first, len(plan)):
            if stop_at is not None and (epoch, w_idx) == stop_at:
                return epoch, w_idx
            start, length = plan[w_idx]
            for j in range(length):
                ids, y = batches[start + j]
                last = j == length - 1
                with fabric.no_backward_sync(model, enabled=not last):
                    loss = F.cross_entropy(model(ids), y)
                    fabric.backward(loss / length)
            opt_lora.step()
            opt_head.step()
            sched.step()
            opt_lora.zero_grad(set_to_none=True)
            opt_head.zero_grad(set_to_none=True)
            state["step"] += 1
        fabric.print(f"epoch {epoch} done, step {state['step']}, loss {loss.item():.4f}")
    return cfg.epochs, 0


def sha_params(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def worker(fabric):
    cfg = Cfg()
    seed_everything(cfg.seed)
    # own sampler (not fabric.setup_dataloaders): its epoch must follow the resumed epoch,
    # not the number of times this loader was iterated
    ds = dataset(cfg, fabric.world_size)
    sampler = DistributedSampler(ds, num_replicas=fabric.world_size, rank=fabric.global_rank,
                                 shuffle=True, seed=cfg.seed)
    loader = DataLoader(ds, batch_size=cfg.micro_bs, sampler=sampler)

    # first job: runs until it is pre-empted, checkpoints at the window boundary
    model, opt_lora, opt_head, sched = build(fabric, cfg, init_seed=cfg.seed)
    state = {"model": model, "opt_lora": opt_lora, "opt_head": opt_head, "sched": sched, "step": 0}
    epoch, w_idx = run_epochs(fabric, cfg, state, loader, 0, 0, stop_at=cfg.stop_at)
    state.update(epoch=epoch, window=w_idx)
    fabric.save(os.path.join(cfg.ckpt_dir, "last.ckpt"), state)
    fabric.barrier()
    del model, opt_lora, opt_head, sched, state

    # second job: fresh objects (different init seed), restored from the checkpoint
    model, opt_lora, opt_head, sched = build(fabric, cfg, init_seed=cfg.seed + 1)
    state = {"model": model, "opt_lora": opt_lora, "opt_head": opt_head, "sched": sched,
             "step": 0, "epoch": 0, "window": 0}
    fabric.load(os.path.join(cfg.ckpt_dir, "last.ckpt"), state)
    fabric.print(f"resumed at epoch {state['epoch']} window {state['window']} step {state['step']}")
    run_epochs(fabric, cfg, state, loader, state["epoch"], state["window"])

    fabric.barrier()
    if fabric.global_rank == 0:
        print(f"optimizer steps {state['step']}", flush=True)
        print(f"FINAL_SHA256 {sha_params(model.module)}", flush=True)
        shutil.rmtree(cfg.ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
    fabric.launch(worker)
