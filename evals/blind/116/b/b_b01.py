"""SFT with a z-loss regulariser (PaLM-style) on a tiny Llama, HF Trainer subclass.

The LM term comes from the stock Trainer loss (token sum over the window's
all-ranks label count); the z-loss is added on top, normalised over the same
tokens so the two terms share one scale.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainingArguments, set_seed)

VOCAB = 96
SEQ = 20


class PromptCompletionSet(Dataset):
    """Random prompt/completion pairs; prompt tokens are masked out of the loss."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            ids = torch.randint(3, VOCAB, (SEQ,), generator=g)
            plen = int(torch.randint(4, 14, (1,), generator=g))
            labels = ids.clone()
            labels[:plen] = -100
            self.items.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


class ZLossTrainer(Trainer):
    def __init__(self, *args, z_coef=1e-2, **kwargs):
        super().__init__(*args, **kwargs)
        self.z_coef = z_coef

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        valid = inputs["labels"][:, 1:].ne(-100)
        lm_loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        lse = torch.logsumexp(outputs.logits[:, :-1].float(), dim=-1)
        z_loss = (lse.pow(2) * valid).sum() / num_items_in_batch
        loss = lm_loss + self.z_coef * z_loss
        return (loss, outputs) if return_outputs else loss


def main():
    set_seed(1234)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)

    args = TrainingArguments(
        output_dir="tmp_scratch/b_b01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=3,
        learning_rate=3e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=1.0,
        weight_decay=0.01,
        logging_steps=100,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        seed=1234,
        dataloader_num_workers=0,
    )
    trainer = ZLossTrainer(model=model, args=args, train_dataset=PromptCompletionSet(40),
                           data_collator=collate, z_coef=0.05)
    trainer.train()

    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
