"""Masked next-token training of a plain nn.Module under the stock HF Trainer (2 ranks).

The module declares `accepts_loss_kwargs = True` and divides its token sum by the
`num_items_in_batch` the Trainer counts over the whole window on all ranks.
Labels are pre-shifted (no shift inside the loss). K = 2 with 5 micro-batches per
rank and epoch (windows 2, 2, 1), a frozen learned position table, a global
clip at 0.5 and a cosine schedule with one warm-up step.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

VOCAB, DIM, MAXLEN, SEED = 50, 32, 24, 99


class TinyTagger(nn.Module):
    accepts_loss_kwargs = True

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(MAXLEN, DIM)
        self.pos.weight.requires_grad_(False)
        layer = nn.TransformerEncoderLayer(DIM, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=2)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None, num_items_in_batch=None):
        T = input_ids.size(1)
        h = self.tok(input_ids) + self.pos(torch.arange(T, device=input_ids.device))
        causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        pad = None if attention_mask is None else attention_mask == 0
        logits = self.out(self.enc(h, mask=causal, src_key_padding_mask=pad))
        if labels is None:
            return {"logits": logits}
        tok_loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1),
                                   ignore_index=-100, reduction="sum")
        denom = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum()
        return {"loss": tok_loss / denom, "logits": logits}


class Shifted(Dataset):
    def __init__(self, n=20):
        g = torch.Generator().manual_seed(SEED)
        self.rows = []
        for _ in range(n):
            L = int(torch.randint(5, 20, (1,), generator=g))
            seq = torch.randint(1, VOCAB, (L + 1,), generator=g)
            labels = seq[1:].clone()
            labels[: int(torch.randint(1, 4, (1,), generator=g))] = -100  # a short prompt
            self.rows.append({"input_ids": seq[:-1], "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    T = max(len(r["input_ids"]) for r in rows)
    b = {"input_ids": torch.zeros(len(rows), T, dtype=torch.long),
         "attention_mask": torch.zeros(len(rows), T, dtype=torch.long),
         "labels": torch.full((len(rows), T), -100, dtype=torch.long)}
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        b["input_ids"][i, :n], b["attention_mask"][i, :n], b["labels"][i, :n] = r["input_ids"], 1, r["labels"]
    return b


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    torch.manual_seed(SEED)
    model = TinyTagger()
    args = TrainingArguments(
        output_dir="tmp_scratch/c03_out", per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_train_epochs=2, learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=1,
        max_grad_norm=0.5, weight_decay=0.01, seed=SEED, data_seed=SEED, use_cpu=True,
        ddp_backend="gloo", save_strategy="no", report_to=[], logging_steps=100, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Shifted(), data_collator=collate)
    trainer.train()
    if trainer.is_world_process_zero():
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {params_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
