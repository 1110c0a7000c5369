"""Token tagging (NER-style) fine-tune of a small Qwen2 encoder head with the stock HF Trainer.

Synthetic sentences of varying length, padded to a fixed width, padding positions labelled -100.
"""
import hashlib
import os

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import Qwen2Config, Qwen2ForTokenClassification, Trainer, TrainingArguments, set_seed

NUM_TAGS = 5
VOCAB = 96
MAX_LEN = 14
SEED = 1234


class TaggingSet(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(3, MAX_LEN + 1, (1,), generator=g))
            ids = torch.randint(1, VOCAB, (length,), generator=g)
            tags = (ids % NUM_TAGS).long()
            # a little noise so that the task is not trivially separable
            flip = torch.rand(length, generator=g) < 0.15
            tags[flip] = torch.randint(0, NUM_TAGS, (int(flip.sum()),), generator=g)
            self.rows.append((ids, tags))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, tags = self.rows[i]
        return {"input_ids": ids, "labels": tags}


def pad_collate(features):
    n = len(features)
    input_ids = torch.zeros(n, MAX_LEN, dtype=torch.long)
    labels = torch.full((n, MAX_LEN), -100, dtype=torch.long)
    mask = torch.zeros(n, MAX_LEN, dtype=torch.long)
    for r, f in enumerate(features):
        L = f["input_ids"].numel()
        input_ids[r, :L] = f["input_ids"]
        labels[r, :L] = f["labels"]
        mask[r, :L] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def build_model():
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        num_labels=NUM_TAGS,
        classifier_dropout=0.0,
    )
    return Qwen2ForTokenClassification(cfg)


def token_ce(outputs, labels, num_items_in_batch=None):
    logits = outputs["logits"].float().reshape(-1, NUM_TAGS)
    loss = torch.nn.functional.cross_entropy(logits, labels.reshape(-1), ignore_index=-100, reduction="sum")
    return loss / num_items_in_batch


def params_sha(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    set_seed(SEED)
    model = build_model()
    train_ds = TaggingSet(32, seed=SEED)

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_b01_out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=3,
        learning_rate=0.05,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        data_collator=pad_collate,
        compute_loss_func=token_ce,
    )
    trainer.train()

    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
