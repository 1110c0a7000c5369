"""Teaching a tiny Llama eight new control tokens with a Trainer subclass.

The vocabulary is grown by 8 rows; the pre-existing embedding rows are kept fixed by
masking their gradient right before every optimizer step (a callback), while the new
rows and the rest of the network train.  The Trainer subclass builds its own optimizer
with separate groups for the embedding table, the norms/biases and the rest.
Answer-only labels (uneven token counts), a clip that acts, and an epoch of 7
micro-batches per rank with K = 3, so every epoch ends on a one-batch window.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments,
                          set_seed)

BASE_VOCAB = 96
NEW_TOKENS = 8
SEQ_LEN = 20
K = 3


class ControlTokenSFT(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            ids = torch.randint(4, BASE_VOCAB, (SEQ_LEN,), generator=g)
            ctrl = BASE_VOCAB + int(torch.randint(0, NEW_TOKENS, (1,), generator=g))
            p = int(torch.randint(3, 10, (1,), generator=g))
            ids[p - 1] = ctrl
            ids[p:] = (ids[:SEQ_LEN - p] + ctrl) % (BASE_VOCAB - 4) + 4
            labels = ids.clone()
            labels[:p] = -100
            self.rows.append({"input_ids": ids, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class FreezeOldRows(TrainerCallback):
    """Zero the gradient of the original vocabulary rows before each optimizer step."""

    def __init__(self, n_old):
        self.n_old = n_old
        self.embedding = None

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.embedding = model.get_input_embeddings().weight

    def on_pre_optimizer_step(self, args, state, control, **kw):
        if self.embedding.grad is not None:
            self.embedding.grad[: self.n_old].zero_()


class GroupedTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            emb, no_decay, rest = [], [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                if "embed_tokens" in n:
                    emb.append(p)
                elif p.ndim < 2:
                    no_decay.append(p)
                else:
                    rest.append(p)
            self.optimizer = torch.optim.AdamW(
                [
                    {"params": emb, "lr": self.args.learning_rate * 3, "weight_decay": 0.0},
                    {"params": no_decay, "weight_decay": 0.0},
                    {"params": rest, "weight_decay": self.args.weight_decay},
                ],
                lr=self.args.learning_rate, betas=(0.9, 0.95), eps=1e-8,
            )
        return self.optimizer


def main():
    torch.use_deterministic_algorithms(True)
    set_seed(99)
    cfg = LlamaConfig(vocab_size=BASE_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.resize_token_embeddings(BASE_VOCAB + NEW_TOKENS, mean_resizing=False)
    args = TrainingArguments(
        output_dir="tmp_scratch/a_c01_out", use_cpu=True, ddp_backend="gloo", report_to=[],
        save_strategy="no", disable_tqdm=True, logging_steps=1, seed=99, data_seed=99,
        per_device_train_batch_size=4, gradient_accumulation_steps=K, num_train_epochs=2,
        learning_rate=2e-3, weight_decay=0.05, lr_scheduler_type="cosine", warmup_steps=1,
        max_grad_norm=0.3,
    )
    ds = ControlTokenSFT(56, seed=3)      # 56 / (2 ranks * 4) = 7 micro-batches per rank: windows 3, 3, 1
    trainer = GroupedTrainer(model=model, args=args, train_dataset=ds, callbacks=[FreezeOldRows(BASE_VOCAB)])
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
