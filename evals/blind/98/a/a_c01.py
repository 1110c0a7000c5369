"""Completion-only SFT of a tiny Llama with a LoRA adapter through the HF Trainer.
LoRA+-style optimizer (B matrices at a higher LR), clipping at 0.3, 7 micro-batches per
epoch per rank with gradient_accumulation_steps=3 (windows of 3, 3, 1), 2 epochs.

Launch: torchrun --nproc-per-node 2 a_c01.py
"""
import argparse
import hashlib
import os

import torch
from torch.utils.data import Dataset
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

PAD = 0


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=3)
    ap.add_argument("--batches-per-epoch", type=int, default=7)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--loraplus-ratio", type=float, default=4.0)
    ap.add_argument("--max-grad-norm", type=float, default=0.3)
    ap.add_argument("--out", default="/tmp/a_c01_out")
    return ap.parse_args()


class PromptCompletion(Dataset):
    """Rows of different prompt and completion lengths; prompts are masked out of the loss."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p = int(torch.randint(2, 9, (1,), generator=g))
            c = int(torch.randint(1, 12, (1,), generator=g))
            ids = torch.randint(3, 100, (p + c,), generator=g)
            self.rows.append((ids, p))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, p = self.rows[i]
        labels = ids.clone()
        labels[:p] = -100
        return {"input_ids": ids, "labels": labels}


def collate(rows):
    L = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), L), PAD)
    labels = torch.full((len(rows), L), -100)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = r["input_ids"], r["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class LoraPlusTrainer(Trainer):
    def __init__(self, *a, loraplus_ratio=4.0, **kw):
        super().__init__(*a, **kw)
        self.loraplus_ratio = loraplus_ratio

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            a_params, b_params = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (b_params if "lora_B" in n else a_params).append(p)
            lr = self.args.learning_rate
            self.optimizer = torch.optim.AdamW(
                [{"params": a_params, "lr": lr}, {"params": b_params, "lr": lr * self.loraplus_ratio}],
                weight_decay=0.0,
            )
        return self.optimizer


def main():
    args = parse()
    set_seed(args.seed)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = LlamaConfig(vocab_size=104, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, tie_word_embeddings=False)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                            task_type="CAUSAL_LM"))
    train = PromptCompletion(args.micro_batch * args.batches_per_epoch * world, args.seed + 100)

    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.grad_accum, num_train_epochs=args.epochs,
        learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=1,
        max_grad_norm=args.max_grad_norm, logging_steps=100, save_strategy="no", report_to="none",
        use_cpu=True, ddp_backend="gloo", dataloader_num_workers=0, remove_unused_columns=False,
        seed=args.seed, data_seed=args.seed, disable_tqdm=True,
    )
    trainer = LoraPlusTrainer(model=model, args=targs, train_dataset=train, data_collator=collate,
                              loraplus_ratio=args.loraplus_ratio)
    trainer.train()

    if trainer.is_world_process_zero():
        named = list(model.named_parameters())
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in named}, os.environ["PARAM_DUMP"])
        h = hashlib.sha256()
        for _, p in named:
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
