"""Tiny GPT-2 language model trained with Lightning Fabric on 2 CPU ranks.

Launched with torchrun; Fabric picks the torchelastic environment up by itself.
Gradient accumulation follows the Fabric guide: skip the DDP all-reduce while
accumulating, step once the accumulation phase is over.
"""
import hashlib
import math

import torch
from torch.utils.data import DataLoader, Dataset
from lightning_fabric import Fabric, seed_everything
from transformers import GPT2Config, GPT2LMHeadModel

HPARAMS = dict(
    seed=2024,
    vocab=80,
    ctx=20,
    n_docs=96,            # 2 ranks x 12 micro-batches of 4
    batch_size=4,
    accumulate=4,
    epochs=2,
    lr=2e-3,
    warmup=1,
)


class RepeatCopyTask(Dataset):
    """First half random, second half repeats it: an easy target for induction heads."""

    def __init__(self, n, ctx, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        half = ctx // 2
        first = torch.randint(1, vocab, (n, half), generator=g)
        self.data = torch.cat([first, first], dim=1)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def cosine_with_warmup(total_steps, warmup):
    def fn(step):
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))
    return fn


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def train(fabric, hp):
    cfg = GPT2Config(
        vocab_size=hp["vocab"], n_positions=hp["ctx"], n_embd=48, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    with fabric.init_module():
        model = GPT2LMHeadModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp["lr"], weight_decay=0.05)
    model, optimizer = fabric.setup(model, optimizer)

    ds = RepeatCopyTask(hp["n_docs"], hp["ctx"], hp["vocab"], hp["seed"])
    loader = fabric.setup_dataloaders(DataLoader(ds, batch_size=hp["batch_size"], shuffle=True))

    steps_per_epoch = len(loader) // hp["accumulate"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, cosine_with_warmup(steps_per_epoch * hp["epochs"], hp["warmup"]))

    model.train()
    for epoch in range(hp["epochs"]):
        for iteration, batch in enumerate(loader):
            # Accumulate gradient `accumulate` batches at a time
            is_accumulating = iteration % hp["accumulate"] != 0

            with fabric.no_backward_sync(model, enabled=is_accumulating):
                out = model(input_ids=batch, labels=batch)
                fabric.backward(out.loss / hp["accumulate"])

            if not is_accumulating:
                # Step the optimizer after the accumulation phase is over
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
        fabric.print(f"epoch {epoch}: last loss {out.loss.item():.4f}")
    return model


def main():
    hp = HPARAMS
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    seed_everything(hp["seed"])
    model = train(fabric, hp)
    fabric.barrier()
    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {digest(model.module)}", flush=True)


if __name__ == "__main__":
    main()
