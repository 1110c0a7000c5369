"""Completion-only SFT of a tiny GPT-2 with the stock HF Trainer: frozen token embedding, a
gradient-norm monitor callback, a clip that acts, and an epoch that does not divide into
full accumulation windows (10 micro-batches per rank, K = 4 -> 4, 4, 2)."""
import hashlib
import os

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

VOCAB, SEQ = 80, 20


class Rows(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            L = int(torch.randint(8, SEQ + 1, (1,), generator=g))
            ids = torch.full((SEQ,), 1, dtype=torch.long)
            ids[:L] = torch.randint(2, VOCAB, (L,), generator=g)
            plen = int(torch.randint(2, L - 2, (1,), generator=g))
            labels = ids.clone()
            labels[:plen] = -100
            labels[L:] = -100
            mask = torch.zeros(SEQ, dtype=torch.long)
            mask[:L] = 1
            self.rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class GradNormMonitor(TrainerCallback):
    """Reads the accumulated gradient norm right before the optimizer step (read-only)."""

    def __init__(self):
        self.norms = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        sq = sum(float(p.grad.float().pow(2).sum()) for p in model.parameters() if p.grad is not None)
        self.norms.append(sq ** 0.5)


def main():
    torch.manual_seed(5)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model.transformer.wte.requires_grad_(False)   # frozen (and tied) token embedding
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c01"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        warmup_steps=1,
        max_grad_norm=0.5,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
        seed=5,
        data_seed=5,
    )
    monitor = GradNormMonitor()
    trainer = Trainer(model=model, args=args, train_dataset=Rows(40, 5), callbacks=[monitor])
    trainer.train()
    if trainer.is_world_process_zero():
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in trainer.model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest(), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
