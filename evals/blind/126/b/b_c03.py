"""Sentence classification with a Trainer subclass that computes its own loss.

Tiny Llama classifier, frozen token embedding, every micro-batch the same size, an epoch of
7 micro-batches per rank at K = 3 (windows 3-3-1). The loss is each micro-batch's mean and
the subclass says so, so the Trainer divides it by the window's length.
"""
import hashlib
import os
import random

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForSequenceClassification, Trainer, TrainingArguments

SEED = 99
VOCAB = 64
N_LABELS = 3


class MeanCETrainer(Trainer):
    loss_is_scaled_for_ga = False  # our loss is a per-micro-batch mean

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits.float(), labels)
        return (loss, outputs) if return_outputs else loss


def make_rows(n, rng):
    rows = []
    for _ in range(n):
        L = rng.randint(4, 12)
        ids = [rng.randint(1, VOCAB - 1) for _ in range(L)]
        rows.append({"input_ids": ids, "label": sum(ids) % N_LABELS})
    return rows


def collate(feats):
    w = max(len(f["input_ids"]) for f in feats)
    ids = torch.tensor([f["input_ids"] + [0] * (w - len(f["input_ids"])) for f in feats])
    mask = torch.tensor([[1] * len(f["input_ids"]) + [0] * (w - len(f["input_ids"])) for f in feats])
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["label"] for f in feats])}


def main():
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      pad_token_id=0, num_labels=N_LABELS)
    model = LlamaForSequenceClassification(cfg)
    model.model.embed_tokens.weight.requires_grad_(False)

    rows = make_rows(28, random.Random(SEED))
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c03_out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_train_epochs=3,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=0.0,
        weight_decay=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=SEED,
        data_seed=SEED,
        ddp_backend="gloo",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = MeanCETrainer(model=model, args=args, train_dataset=rows, data_collator=collate)
    trainer.train()
    if trainer.is_world_process_zero():
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in trainer.model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
