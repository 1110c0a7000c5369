"""HF Trainer subclass on 2 CPU ranks: completion-only SFT of a tiny random GPT-2.

Custom optimizer groups (no decay on biases/LayerNorm, a smaller LR for the embeddings),
a vocabulary resized after construction, masked prompts (the stock Trainer normalises by
the window's all-ranks target count), an epoch of 7 micro-batches per rank with
gradient_accumulation_steps=3 (a one-batch last window) and a clip that acts.
"""
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

SEED, VOCAB, NEW_VOCAB, SEQ = 5, 64, 72, 16


class PromptCompletion(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(0, NEW_VOCAB, (n, SEQ), generator=g)
        self.prompt_len = torch.randint(3, 10, (n,), generator=g)
        self.total_len = torch.randint(11, SEQ + 1, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i].clone()
        attn = (torch.arange(SEQ) < self.total_len[i]).long()
        labels = ids.clone()
        labels[: self.prompt_len[i]] = -100
        labels[attn == 0] = -100
        return {"input_ids": ids, "attention_mask": attn, "labels": labels}


class GroupedLRTrainer(Trainer):
    def create_optimizer(self):
        if self.optimizer is None:
            decay, no_decay, emb = [], [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                if "wte" in n or "wpe" in n:
                    emb.append(p)
                elif n.endswith("bias") or ".ln_" in n:
                    no_decay.append(p)
                else:
                    decay.append(p)
            lr = self.args.learning_rate
            self.optimizer = torch.optim.AdamW([
                {"params": decay, "weight_decay": 0.1, "lr": lr},
                {"params": no_decay, "weight_decay": 0.0, "lr": lr},
                {"params": emb, "weight_decay": 0.0, "lr": lr * 0.3},
            ], betas=(0.9, 0.95))
        return self.optimizer


def main():
    set_seed(SEED)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    model.resize_token_embeddings(NEW_VOCAB)
    args = TrainingArguments(
        output_dir="/tmp/wa87_a_c01_out", per_device_train_batch_size=2,
        gradient_accumulation_steps=3, num_train_epochs=2, learning_rate=2e-3,
        lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.3,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
        seed=SEED, data_seed=SEED, dataloader_drop_last=False, disable_tqdm=True,
    )
    trainer = GroupedLRTrainer(model=model, args=args, train_dataset=PromptCompletion(28))
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
