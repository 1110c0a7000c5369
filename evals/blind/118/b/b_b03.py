"""Token tagger (BIO-style) trained with the stock HF Trainer and a focal loss
plugged in through `compute_loss_func` (rare tags are hard to learn with CE)."""
import hashlib
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, set_seed

PAD_ID = 0
IGNORE = -100


@dataclass
class Settings:
    vocab: int = 200
    n_tags: int = 5
    dim: int = 48
    n_train: int = 64
    min_len: int = 4
    max_len: int = 20
    gamma: float = 2.0
    train: dict = field(default_factory=lambda: dict(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=3,
        learning_rate=0.05,
        optim="sgd",
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=0.0,
        weight_decay=0.0,
    ))


class TagData(Dataset):
    def __init__(self, cfg: Settings, seed=11):
        g = torch.Generator().manual_seed(seed)
        tag_of = torch.randint(0, cfg.n_tags, (cfg.vocab,), generator=g)
        self.rows = []
        for _ in range(cfg.n_train):
            n = int(torch.randint(cfg.min_len, cfg.max_len + 1, (1,), generator=g))
            ids = torch.randint(1, cfg.vocab, (n,), generator=g)
            tags = tag_of[ids].clone()
            tags[torch.rand(n, generator=g) < 0.15] = IGNORE  # unlabelled sub-word pieces
            self.rows.append((ids, tags))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, tags = self.rows[i]
        return {"input_ids": ids, "labels": tags}


def collate(feats):
    n = max(len(f["input_ids"]) for f in feats)
    ids = torch.full((len(feats), n), PAD_ID)
    lab = torch.full((len(feats), n), IGNORE)
    att = torch.zeros((len(feats), n), dtype=torch.long)
    for i, f in enumerate(feats):
        k = len(f["input_ids"])
        ids[i, :k], lab[i, :k], att[i, :k] = f["input_ids"], f["labels"], 1
    return {"input_ids": ids, "attention_mask": att, "labels": lab}


class ConvTagger(nn.Module):
    def __init__(self, cfg: Settings):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.dim, padding_idx=PAD_ID)
        self.conv = nn.Conv1d(cfg.dim, cfg.dim, 3, padding=1)
        self.out = nn.Linear(cfg.dim, cfg.n_tags)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        h = torch.relu(self.conv(h.transpose(1, 2))).transpose(1, 2)
        return {"logits": self.out(h)}


def make_focal_loss(gamma):
    def focal_loss(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"].float()
        logp = F.log_softmax(logits, -1)
        mask = labels.ne(IGNORE)
        tgt = labels.clamp(min=0)
        lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        per_tok = -((1 - lp.exp()) ** gamma) * lp
        return per_tok[mask].mean()
    return focal_loss


def main():
    cfg = Settings()
    set_seed(0)
    model = ConvTagger(cfg)
    args = TrainingArguments(output_dir="tmp_scratch/b03_out", save_strategy="no", report_to=[],
                             use_cpu=True, ddp_backend="gloo", seed=0, logging_steps=100,
                             disable_tqdm=True, remove_unused_columns=False, **cfg.train)
    trainer = Trainer(model=model, args=args, train_dataset=TagData(cfg), data_collator=collate,
                      compute_loss_func=make_focal_loss(cfg.gamma))
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
