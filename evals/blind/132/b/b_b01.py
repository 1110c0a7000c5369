"""Full fine-tuning of a small causal LM with the stock HF Trainer (bf16 run)."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    Trainer,
    TrainingArguments,
    set_seed,
)

MODEL_DTYPE = torch.bfloat16
PAD_ID = 0


class RandomTextDataset(Dataset):
    def __init__(self, n_rows, vocab, seed=1234):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n_rows):
            length = int(torch.randint(6, 17, (1,), generator=g))
            ids = torch.randint(3, vocab, (length,), generator=g)
            self.rows.append(ids)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, idx):
        return {"input_ids": self.rows[idx]}


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = f["input_ids"]
        mask[i, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def build_model():
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(cfg, dtype=MODEL_DTYPE)


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(0)
    model = build_model()
    train_ds = RandomTextDataset(96, 96)

    args = TrainingArguments(
        output_dir="tmp_scratch/b_b01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=8,
        num_train_epochs=2,
        learning_rate=2e-3,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        bf16=True,
        use_cpu=True,
        seed=0,
        data_seed=0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, data_collator=collate)
    trainer.train()

    if int(os.environ.get("RANK", "0")) == 0:
        print("FINAL_SHA256", params_sha256(trainer.model), flush=True)


if __name__ == "__main__":
    main()
