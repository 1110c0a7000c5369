"""Intent classification: a LoRA-adapted tiny Llama encoder plus a linear head,
trained with Lightning Fabric (DDP, 2 CPU ranks).

The adapter and the head are set up as two Fabric modules with their own
optimizers (AdamW for the adapter, SGD with momentum for the head).  K = 3
micro-batches per update; an epoch has 8 micro-batches per rank, so windows
are 3-3-2 and each window's loss is the sample mean over that window.
"""
import contextlib
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaModel


@dataclass
class Cfg:
    vocab: int = 64
    seq: int = 16
    n_classes: int = 4
    n: int = 64
    batch: int = 4
    accum: int = 3
    epochs: int = 3
    lr_adapter: float = 5e-3
    lr_head: float = 0.05
    clip: float = 0.5
    seed: int = 99


def dataset(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(1, cfg.vocab, (cfg.n, cfg.seq), generator=g)
    lens = torch.randint(6, cfg.seq + 1, (cfg.n,), generator=g)
    mask = (torch.arange(cfg.seq)[None] < lens[:, None]).long()
    y = (ids[:, 0] + ids[:, 1]) % cfg.n_classes
    return TensorDataset(ids, mask, y)


def pooled(encoder, ids, mask):
    h = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1)


def main():
    cfg = Cfg()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(cfg.seed)

    base = LlamaModel(LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                  max_position_embeddings=32))
    encoder = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0,
                                              target_modules=["q_proj", "v_proj"]))
    head = nn.Linear(32, cfg.n_classes)

    opt_enc = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=cfg.lr_adapter)
    opt_head = torch.optim.SGD(head.parameters(), lr=cfg.lr_head, momentum=0.9)
    encoder, opt_enc = fabric.setup(encoder, opt_enc)
    head, opt_head = fabric.setup(head, opt_head)

    loader = fabric.setup_dataloaders(DataLoader(dataset(cfg), batch_size=cfg.batch, shuffle=True))
    n_micro = len(loader)
    assert n_micro == 8, n_micro

    for epoch in range(cfg.epochs):
        for i, (ids, mask, y) in enumerate(loader):
            win_start = (i // cfg.accum) * cfg.accum
            win_len = min(cfg.accum, n_micro - win_start)
            last = (i == win_start + win_len - 1)
            ctx = contextlib.ExitStack()
            if not last:
                ctx.enter_context(fabric.no_backward_sync(encoder))
                ctx.enter_context(fabric.no_backward_sync(head))
            with ctx:
                logits = head(pooled(encoder, ids, mask))
                loss = F.cross_entropy(logits, y) / win_len
                fabric.backward(loss)
            if last:
                fabric.clip_gradients(encoder, opt_enc, max_norm=cfg.clip)
                opt_enc.step()
                opt_head.step()
                opt_enc.zero_grad()
                opt_head.zero_grad()

    if fabric.global_rank == 0:
        h = hashlib.sha256()
        for mod in (encoder.module, head.module):
            for _, p in mod.named_parameters():
                h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
