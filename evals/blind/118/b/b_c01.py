"""Instruction SFT of a tiny GPT-2 with the stock Trainer: new special tokens
(vocabulary grown), frozen position table, prompt tokens masked out of the loss,
a clip that acts and a short last window every epoch (3-3-1)."""
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

BASE_VOCAB, NEW_TOKENS = 100, 4
PAD = 0


class PromptAnswer(Dataset):
    def __init__(self, n=56, seed=5):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            lp = int(torch.randint(2, 7, (1,), generator=g))
            la = int(torch.randint(1, 9, (1,), generator=g))
            prompt = torch.randint(1, BASE_VOCAB, (lp,), generator=g)
            answer = (prompt[:1] + torch.arange(la)) % BASE_VOCAB + 1
            ids = torch.cat([torch.tensor([BASE_VOCAB]), prompt, torch.tensor([BASE_VOCAB + 1]),
                             answer, torch.tensor([BASE_VOCAB + 2])])
            labels = ids.clone()
            labels[: lp + 2] = -100
            self.rows.append((ids, labels))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, labels = self.rows[i]
        return {"input_ids": ids, "labels": labels}


def pad_collate(feats):
    n = max(len(f["input_ids"]) for f in feats)
    out = {"input_ids": torch.full((len(feats), n), PAD), "labels": torch.full((len(feats), n), -100),
           "attention_mask": torch.zeros((len(feats), n), dtype=torch.long)}
    for i, f in enumerate(feats):
        k = len(f["input_ids"])
        out["input_ids"][i, :k] = f["input_ids"]
        out["labels"][i, :k] = f["labels"]
        out["attention_mask"][i, :k] = 1
    return out


def main():
    set_seed(1)
    cfg = GPT2Config(vocab_size=BASE_VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD)
    model = GPT2LMHeadModel(cfg)
    model.resize_token_embeddings(BASE_VOCAB + NEW_TOKENS, mean_resizing=False)
    model.transformer.wpe.weight.requires_grad_(False)

    args = TrainingArguments(
        output_dir="tmp_scratch/c01_out", per_device_train_batch_size=4, gradient_accumulation_steps=3,
        num_train_epochs=3, learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=2,
        max_grad_norm=0.5, weight_decay=0.01, optim="adamw_torch", save_strategy="no", report_to=[],
        use_cpu=True, ddp_backend="gloo", seed=1, logging_steps=100, disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptAnswer(), data_collator=pad_collate)
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
