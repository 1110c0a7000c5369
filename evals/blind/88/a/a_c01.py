"""Completion-only SFT of a tiny Llama with the stock HF Trainer on 2 ranks.

Prompts and completions of varying length, a frozen embedding table, clipping at 0.5 and an
epoch whose last accumulation window holds only 2 of the 4 micro-batches.
"""
import hashlib
import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB, MAXLEN, PAD = 100, 20, 0


class Pairs(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p = int(torch.randint(2, 8, (1,), generator=g))
            c = int(torch.randint(1, MAXLEN - p + 1, (1,), generator=g))
            self.rows.append((torch.randint(1, VOCAB, (p + c,), generator=g), p))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    ids = torch.full((len(rows), MAXLEN), PAD)
    att = torch.zeros_like(ids)
    lab = torch.full_like(ids, -100)
    for i, (seq, p) in enumerate(rows):
        ids[i, :len(seq)] = seq
        att[i, :len(seq)] = 1
        lab[i, p:len(seq)] = seq[p:]
    return {"input_ids": ids, "attention_mask": att, "labels": lab}


def main():
    args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "blind88a_c01_run"),
        per_device_train_batch_size=4, gradient_accumulation_steps=4, num_train_epochs=2,
        learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=2, max_grad_norm=0.5,
        weight_decay=0.01, seed=21, data_seed=21, report_to="none", save_strategy="no",
        logging_steps=1000, ddp_backend="gloo", use_cpu=True, disable_tqdm=True,
        remove_unused_columns=False,
    )
    set_seed(args.seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=MAXLEN, pad_token_id=PAD,
                                         tie_word_embeddings=False, initializer_range=0.1))
    model.get_input_embeddings().weight.requires_grad_(False)
    # 144 rows -> 18 micro-batches per rank per epoch -> windows of 4,4,4,4,2
    trainer = Trainer(model=model, args=args, train_dataset=Pairs(144, seed=3), data_collator=collate)
    trainer.train()
    if trainer.is_world_process_zero():
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
