"""HF Trainer subclass: two AdamW groups (no decay on norms/biases, a slower lm_head), frozen
token embeddings, masked prompts, an epoch of 10 micro-batches per rank at K = 4 (windows of
4, 4 and 2), and a clip that acts. The loss is the stock causal-LM loss over the Trainer's
`num_items_in_batch`.
"""
import hashlib
import os

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB, SEED = 72, 21


class PromptData(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.rows = []
        for _ in range(n):
            p = int(torch.randint(1, 9, (1,), generator=g))
            c = int(torch.randint(2, 15, (1,), generator=g))
            ids = torch.randint(3, VOCAB, (p + c,), generator=g)
            lab = ids.clone()
            lab[:p] = -100
            self.rows.append((ids, lab))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i][0], "labels": self.rows[i][1]}


def pad_collate(batch):
    w = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), w, dtype=torch.long)
    att = torch.zeros(len(batch), w, dtype=torch.long)
    lab = torch.full((len(batch), w), -100, dtype=torch.long)
    for r, b in enumerate(batch):
        n = len(b["input_ids"])
        ids[r, :n], att[r, :n], lab[r, :n] = b["input_ids"], 1, b["labels"]
    return {"input_ids": ids, "attention_mask": att, "labels": lab}


class GroupedTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            decay, no_decay, head = [], [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                if n.startswith("lm_head"):
                    head.append(p)
                elif p.ndim < 2:
                    no_decay.append(p)
                else:
                    decay.append(p)
            lr = self.args.learning_rate
            self.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.1, "lr": lr},
                 {"params": no_decay, "weight_decay": 0.0, "lr": lr},
                 {"params": head, "weight_decay": 0.0, "lr": lr * 0.3}],
                betas=(0.9, 0.95))
        return self.optimizer


def main():
    set_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.get_input_embeddings().weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c02_out"),
        per_device_train_batch_size=2, gradient_accumulation_steps=4, num_train_epochs=2,
        learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.25,
        logging_steps=1000, save_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo",
        seed=SEED, data_seed=SEED, disable_tqdm=True,
    )
    trainer = GroupedTrainer(model=model, args=args, train_dataset=PromptData(40), data_collator=pad_collate)
    trainer.train()
    if args.process_index == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in trainer.model.named_parameters()])
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()}", flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
