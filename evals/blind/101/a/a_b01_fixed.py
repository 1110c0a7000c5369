"""Multi-task fine-tuning with the HF Trainer: token tagging + sequence classification.

The tagging loss is a token sum over the whole accumulated batch (num_items_in_batch),
so we tell the Trainer not to divide it by the accumulation steps again.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, set_seed


@dataclass
class TaskConfig:
    vocab: int = 97
    n_tags: int = 11
    n_classes: int = 5
    hidden: int = 48
    seq_len: int = 16
    cls_weight: float = 0.5
    n_samples: int = 192
    per_device_bs: int = 4
    grad_accum: int = 4
    lr: float = 3e-3


class TaggerWithHead(nn.Module):
    def __init__(self, cfg: TaskConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.mix = nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.hidden))
        self.tagger = nn.Linear(cfg.hidden, cfg.n_tags)
        self.cls_head = nn.Linear(cfg.hidden, cfg.n_classes)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        h = self.embed(input_ids)
        h = h + self.mix(h)
        m = attention_mask.unsqueeze(-1).float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        return {"tag_logits": self.tagger(h), "cls_logits": self.cls_head(pooled)}


class SyntheticTagging(Dataset):
    def __init__(self, cfg: TaskConfig, seed=1234):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(cfg.n_samples):
            n = int(torch.randint(3, cfg.seq_len + 1, (1,), generator=g))
            ids = torch.zeros(cfg.seq_len, dtype=torch.long)
            ids[:n] = torch.randint(1, cfg.vocab, (n,), generator=g)
            mask = torch.zeros(cfg.seq_len, dtype=torch.long)
            mask[:n] = 1
            tags = torch.full((cfg.seq_len,), -100, dtype=torch.long)
            tags[:n] = ids[:n] % cfg.n_tags
            # some tokens carry no tag
            drop = torch.rand(cfg.seq_len, generator=g) < 0.3
            tags[drop] = -100
            cls = int(ids[:n].sum()) % cfg.n_classes
            self.items.append({"input_ids": ids, "attention_mask": mask, "labels": tags,
                               "cls_label": torch.tensor(cls)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


class MultiTaskTrainer(Trainer):
    # our compute_loss normalises over the accumulated batch itself
    loss_is_scaled_for_ga = True

    def __init__(self, *a, task_cfg: TaskConfig, **kw):
        super().__init__(*a, **kw)
        self.task_cfg = task_cfg

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        cls_label = inputs.pop("cls_label")
        out = model(**inputs)
        tag_sum = F.cross_entropy(out["tag_logits"].flatten(0, 1), labels.flatten(),
                                  ignore_index=-100, reduction="sum")
        tag_loss = tag_sum / num_items_in_batch
        cls_loss = F.cross_entropy(out["cls_logits"], cls_label)
        # DDP averages over ranks, num_items_in_batch already counts every rank
        # the classification mean is per micro-batch: scale it to the accumulated batch
        loss = (tag_loss * self.accelerator.num_processes
                + self.task_cfg.cls_weight * cls_loss / self.current_gradient_accumulation_steps)
        return (loss, out) if return_outputs else loss


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TaskConfig()
    set_seed(0)
    model = TaggerWithHead(cfg)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_b01_out"),
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=1,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=50,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        data_seed=0,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    trainer = MultiTaskTrainer(model=model, args=args, train_dataset=SyntheticTagging(cfg),
                               data_collator=collate, task_cfg=cfg)
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"FINAL_SHA256 {final_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
