"""Completion-only SFT of a tiny Llama with the HF Trainer; the collator carries a per-sample id for bookkeeping."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ, VOCAB, PAD = 24, 96, 0


class PromptCompletionSet(Dataset):
    """Prompt tokens are masked from the loss; prompt length varies a lot, so supervised counts are uneven."""

    def __init__(self, n=160, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for i in range(n):
            ids = torch.randint(1, VOCAB, (SEQ,), generator=g)
            prompt_len = int(torch.randint(2, SEQ - 3, (1,), generator=g))
            labels = ids.clone()
            labels[:prompt_len] = -100
            self.rows.append({"input_ids": ids, "labels": labels, "sample_id": i})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    return {
        "input_ids": torch.stack([r["input_ids"] for r in rows]),
        "attention_mask": torch.ones(len(rows), SEQ, dtype=torch.long),
        "labels": torch.stack([r["labels"] for r in rows]),
        "sample_id": torch.tensor([r["sample_id"] for r in rows]),
    }


class BookkeepingTrainer(Trainer):
    """Strips `sample_id` from the batches (the model does not take it) and records which samples were seen."""

    seen_ids = []

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples = []
        for _ in range(num_batches):
            try:
                batch = next(epoch_iterator)
            except StopIteration:
                break
            self.seen_ids.extend(batch.pop("sample_id").tolist())
            batch_samples.append(batch)
        if not batch_samples:
            return batch_samples, None
        # Causal LM: the first label position is never predicted.
        num_items_in_batch = sum((b["labels"][..., 1:] != -100).sum() for b in batch_samples).to(device)
        num_items_in_batch = self.accelerator.gather(num_items_in_batch).sum()
        return batch_samples, num_items_in_batch


def main():
    set_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "out_" + os.path.splitext(os.path.basename(__file__))[0]),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        seed=0,
        data_seed=0,
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = BookkeepingTrainer(model=model, args=args, train_dataset=PromptCompletionSet(), data_collator=collate)
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
