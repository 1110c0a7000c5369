"""Completion-only SFT of a tiny GPT-2 with the stock HF Trainer on 2 ranks.
Prompts are masked, sequences are ragged, the first block is frozen, the gradient clip is tight,
and an epoch of 7 micro-batches per rank at GA 3 ends in a one-micro-batch window.

torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 34007 a_c01.py
"""
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

SEED = 21
VOCAB, MAXLEN, PAD = 100, 16, 0


class PromptCompletion(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p_len = int(torch.randint(2, 7, (1,), generator=g))
            c_len = int(torch.randint(2, MAXLEN - p_len + 1, (1,), generator=g))
            prompt = torch.randint(3, VOCAB, (p_len,), generator=g)
            completion = (prompt[-1] + torch.arange(1, c_len + 1) * 7) % (VOCAB - 3) + 3
            ids = torch.full((MAXLEN,), PAD)
            ids[:p_len] = prompt
            ids[p_len:p_len + c_len] = completion
            labels = torch.full((MAXLEN,), -100)
            labels[p_len:p_len + c_len] = completion
            mask = torch.zeros(MAXLEN, dtype=torch.long)
            mask[:p_len + c_len] = 1
            self.rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD)
    model = GPT2LMHeadModel(cfg)
    model.transformer.h[0].requires_grad_(False)

    args = TrainingArguments(
        output_dir="_out_a_c01", per_device_train_batch_size=4, gradient_accumulation_steps=3,
        num_train_epochs=2, learning_rate=2e-3, warmup_steps=2, lr_scheduler_type="linear",
        max_grad_norm=0.3, average_tokens_across_devices=True, seed=SEED, data_seed=SEED,
        use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no",
        logging_strategy="no", disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptCompletion(56, SEED))
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
