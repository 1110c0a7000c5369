"""Completion-only SFT with a Trainer subclass on a tiny Llama (random init), 2 DDP ranks.

* the vocabulary is resized for two added special tokens and the input embedding is frozen;
* `create_optimizer` builds two AdamW groups (attention vs. the rest) itself;
* the built-in clip is off (max_grad_norm=0); a callback clips at 0.3 right before the step;
* 50 examples, 2 per device, K=4: each epoch ends in a one-batch window.
"""
import hashlib
import os

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

K = 4


class PreStepClip(TrainerCallback):
    def __init__(self, max_norm):
        self.max_norm = max_norm

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        params = [p for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)


class TwoGroupTrainer(Trainer):
    def create_optimizer(self):
        if self.optimizer is None:
            attn, rest = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (attn if "self_attn" in n else rest).append(p)
            self.optimizer = torch.optim.AdamW([
                {"params": attn, "lr": 2e-3, "weight_decay": 0.0},
                {"params": rest, "lr": 4e-3, "weight_decay": 0.05},
            ], betas=(0.9, 0.98))
        return self.optimizer


class SFTData(torch.utils.data.Dataset):
    def __init__(self, n=50, t=14, vocab=66, seed=9):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, vocab, (n, t), generator=g)
        self.ids[:, 0] = 64  # <|user|>
        self.sep = torch.randint(3, t - 3, (n,), generator=g)
        self.end = torch.randint(t - 5, t + 1, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i].clone()
        ids[self.sep[i]] = 65  # <|assistant|>
        att = (torch.arange(len(ids)) < self.end[i]).long()
        ids = ids.masked_fill(att == 0, 0)
        labels = ids.masked_fill(torch.arange(len(ids)) <= self.sep[i], -100).masked_fill(att == 0, -100)
        return {"input_ids": ids, "attention_mask": att, "labels": labels}


def main():
    args = TrainingArguments(output_dir="tmp_scratch/a_c03_out", per_device_train_batch_size=2,
                             gradient_accumulation_steps=K, num_train_epochs=2, learning_rate=4e-3,
                             lr_scheduler_type="cosine", warmup_steps=2, max_grad_norm=0.0,
                             seed=77, data_seed=77, save_strategy="no", report_to=[], use_cpu=True,
                             ddp_backend="gloo", logging_steps=1, disable_tqdm=True)
    set_seed(77)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg)
    model.resize_token_embeddings(66, mean_resizing=False)
    model.get_input_embeddings().weight.requires_grad_(False)
    trainer = TwoGroupTrainer(model=model, args=args, train_dataset=SFTData(),
                              callbacks=[PreStepClip(0.3)])
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
