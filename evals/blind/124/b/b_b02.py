"""Query/passage dual encoder trained with in-batch negatives (InfoNCE) on the HF Trainer.

CLIP-style learnable temperature: the logit scale is learned jointly with the encoder.
"""
import hashlib
import math
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import BertConfig, BertModel, Trainer, TrainingArguments, set_seed

SEED = 7
VOCAB = 96
N_PAIRS = 64


class PairDataset(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.q = torch.randint(1, VOCAB, (n, 8), generator=g)
        self.d = torch.randint(1, VOCAB, (n, 12), generator=g)
        # make positives share a few tokens with their query
        self.d[:, :4] = self.q[:, :4]

    def __len__(self):
        return len(self.q)

    def __getitem__(self, i):
        return {"query_ids": self.q[i], "doc_ids": self.d[i]}


def collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


class DualEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=32, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
        self.encoder = BertModel(cfg, add_pooling_layer=False)
        self.proj = nn.Linear(32, 16)

    def embed(self, ids):
        h = self.encoder(input_ids=ids).last_hidden_state.mean(dim=1)
        return F.normalize(self.proj(h), dim=-1)

    def forward(self, query_ids, doc_ids):
        return self.embed(query_ids), self.embed(doc_ids)


class ContrastiveTrainer(Trainer):
    def __init__(self, *args, init_temperature=0.07, **kwargs):
        super().__init__(*args, **kwargs)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / init_temperature)))

    def create_optimizer(self, model=None):
        opt = super().create_optimizer(model)
        opt.add_param_group({"params": [self.logit_scale], "weight_decay": 0.0})
        return opt

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q, d = model(**inputs)
        logits = self.logit_scale.exp() * q @ d.t()
        targets = torch.arange(q.size(0), device=q.device)
        loss = 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets))
        return (loss, (q, d)) if return_outputs else loss

    def trained_parameters(self):
        yield "logit_scale", self.logit_scale
        yield from self.model.named_parameters()


def param_sha(named):
    h = hashlib.sha256()
    for _, p in named:
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    model = DualEncoder()
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="b02_"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=3,
        learning_rate=2e-3,
        weight_decay=0.0,
        warmup_steps=0,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        use_cpu=True,
        seed=SEED,
        data_seed=SEED,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = ContrastiveTrainer(model=model, args=args, train_dataset=PairDataset(N_PAIRS, SEED),
                                 data_collator=collate)
    assert trainer.args.world_size == 2
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {param_sha(trainer.trained_parameters())}", flush=True)


if __name__ == "__main__":
    main()
