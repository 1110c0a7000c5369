"""Sequence classification with the stock HF Trainer on a PEFT LoRA model.

LoRA on attention plus a fully trained classification head (`modules_to_save=["score"]`),
a worker DataLoader, K = 2. 40 samples over 2 ranks at 4 per device -> 5 micro-batches per
rank per epoch: windows 2, 2, 1 (the Trainer divides the 1-batch tail by 1, not by 2).

The Llama sequence-classification head takes **kwargs but does not pass `num_items_in_batch`
on to its loss (it returns the batch mean), so the Trainer is told the model does not take
loss kwargs: it then divides each micro-batch mean by the window's length itself.
"""
import hashlib
import tempfile

import torch
from peft import LoraConfig, TaskType, get_peft_model
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForSequenceClassification, Trainer,
                          TrainingArguments, set_seed)

SEED = 314
VOCAB = 100
SEQ = 10
N_LABELS = 3


class ToyClassification(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
        self.y = (self.ids[:, 0] % N_LABELS)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.y[i]}


def collate(rows):
    return {"input_ids": torch.stack([r["input_ids"] for r in rows]),
            "attention_mask": torch.ones(len(rows), SEQ, dtype=torch.long),
            "labels": torch.stack([r["labels"] for r in rows])}


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                      num_labels=N_LABELS, pad_token_id=0)
    base = LlamaForSequenceClassification(cfg)
    model = get_peft_model(base, LoraConfig(task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8,
                                            lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["score"]))
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="b_c03_"),
                             per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             num_train_epochs=3, learning_rate=5e-3, weight_decay=0.0,
                             lr_scheduler_type="cosine", warmup_steps=0, max_grad_norm=1.0,
                             use_cpu=True, seed=SEED, data_seed=SEED, report_to=[],
                             dataloader_num_workers=1, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True,
                             remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=ToyClassification(40),
                      data_collator=collate)
    trainer.model_accepts_loss_kwargs = False
    assert trainer.args.world_size == 2
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {param_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
