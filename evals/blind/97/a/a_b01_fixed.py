"""SFT of a tiny Llama with the HF Trainer on 2 ranks, gradient accumulation 4.

A callback records the gradient norm of every micro-batch (for a gradient-noise-scale
estimate, as in McCandlish et al.). To see one micro-batch at a time it moves `.grad`
into a stash after each accumulation sub-step and puts the stash back for the update.
"""
import hashlib
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

VOCAB, SEQ, PROMPT = 128, 16, 6


class PromptDataset(Dataset):
    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, VOCAB, (n, SEQ), generator=g)
        self.plen = torch.randint(2, PROMPT + 1, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: self.plen[i]] = -100          # prompt tokens are not trained on
        return {"input_ids": ids, "labels": labels}


class MicroBatchGradStats(TrainerCallback):
    """Per-micro-batch gradient norms; the window's gradient is rebuilt before the update."""

    def __init__(self):
        self.stash = {}
        self.micro_norms = []

    def on_substep_end(self, args, state, control, model=None, **kwargs):
        sq = 0.0
        for p in model.parameters():
            if p.grad is None:
                continue
            sq += float(p.grad.float().pow(2).sum())
            if p in self.stash:
                self.stash[p].add_(p.grad)
            else:
                self.stash[p] = p.grad.detach().clone()
            p.grad = None
        self.micro_norms.append(sq ** 0.5)

    def _restore(self):
        # the stashed micro-batches were accumulated under no_sync: average them over ranks
        for p, buf in self.stash.items():
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(buf)
                buf /= dist.get_world_size()
            if p.grad is None:
                p.grad = buf
            else:
                p.grad.add_(buf)
        self.stash = {}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._restore()


def main():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    model = LlamaForCausalLM(cfg)

    args = TrainingArguments(
        output_dir="tmp_scratch/a_b01_out", per_device_train_batch_size=2,
        gradient_accumulation_steps=4, num_train_epochs=3, learning_rate=3e-3,
        lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.01,
        max_grad_norm=0.0,                     # no clipping; the warm-up keeps early steps sane
        logging_steps=100, save_strategy="no", report_to="none", use_cpu=True,
        ddp_backend="gloo", ddp_find_unused_parameters=False, seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptDataset(64),
                      callbacks=[MicroBatchGradStats()])
    trainer.train()

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().numpy().astype(np.float32).tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
