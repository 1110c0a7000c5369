"""Multi-task tagger-LM: next-token loss plus an auxiliary token-tagging loss,
trained with an HF Trainer subclass that adds the auxiliary term in compute_loss.

Run: torchrun --nproc-per-node 2 ... b_b02.py
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments, set_seed

VOCAB, N_TAGS, DIM, SEQ = 101, 5, 32, 20


@dataclass
class RunConfig:
    accum: int = 3
    per_device_bs: int = 2
    n_samples: int = 80  # 40 per rank -> 20 micro-batches -> windows 3,3,3,3,3,3,2
    epochs: int = 2
    lr: float = 2e-3
    tag_weight: float = 0.5


class TaggerLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.lm_head = nn.Linear(DIM, VOCAB)
        self.tag_head = nn.Linear(DIM, N_TAGS)

    def forward(self, input_ids, labels=None, tag_labels=None, **kwargs):
        h, _ = self.rnn(self.emb(input_ids))
        logits = self.lm_head(h)
        out = {"logits": logits, "tag_logits": self.tag_head(h)}
        if labels is not None:
            n = kwargs.get("num_items_in_batch")
            s = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
            out["loss"] = s / (n if n is not None else labels.ne(-100).sum())
        return out


class SyntheticTagging(torch.utils.data.Dataset):
    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        lab = torch.roll(self.ids, -1, dims=1)
        lab[:, -1] = -100
        # variable-length padding at the end: fewer supervised tokens on some rows
        keep = torch.randint(5, SEQ, (n,), generator=g)
        pos = torch.arange(SEQ).view(1, -1)
        lab[pos >= keep.view(-1, 1)] = -100
        tags = (self.ids % N_TAGS).clone()
        tags[lab.eq(-100)] = -100
        self.labels, self.tags = lab, tags

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i], "tag_labels": self.tags[i]}


class MultiTaskTrainer(Trainer):
    def __init__(self, *a, tag_weight=1.0, **kw):
        super().__init__(*a, **kw)
        self.tag_weight = tag_weight

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        tag_labels = inputs["tag_labels"]
        # LM term: the stock path (the model normalises by the window's token count)
        lm_loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        # Tagging term on the same supervised positions, same window-level normaliser
        tag_sum = F.cross_entropy(
            outputs["tag_logits"].flatten(0, 1), tag_labels.flatten(), ignore_index=-100, reduction="sum"
        )
        tag_loss = tag_sum / num_items_in_batch
        loss = lm_loss + self.tag_weight * tag_loss
        return (loss, outputs) if return_outputs else loss


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    set_seed(7)
    torch.use_deterministic_algorithms(True)
    model = TaggerLM()
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=0.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        seed=7,
        data_seed=7,
        remove_unused_columns=False,
    )
    trainer = MultiTaskTrainer(
        model=model, args=args, train_dataset=SyntheticTagging(cfg.n_samples), tag_weight=cfg.tag_weight
    )
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"FINAL_SHA256 {param_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
