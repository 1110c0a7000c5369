"""Intent-tagged SFT on a tiny GPT-2 with the HF Trainer (2 ranks, K=4).

Memory-lean recipe: the model config carries the training dtype, so the model
is materialised directly in that dtype and the Trainer runs with bf16=True.
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset
from transformers import (AutoModelForCausalLM, GPT2Config, Trainer,
                          TrainingArguments, set_seed)


@dataclass
class RunConfig:
    vocab: int = 96
    seq_len: int = 24
    n_samples: int = 96
    per_device_batch: int = 2
    grad_accum: int = 4
    lr: float = 3e-3
    model_dtype: str = "float32"  # master weights stay fp32; bf16=True autocasts
    out_dir: str = field(default_factory=lambda: os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b03"))


class SyntheticSFT(Dataset):
    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(4, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
        # prompt part (first 6 tokens) is not trained on
        self.labels = self.ids.clone()
        self.labels[:, :6] = -100

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def build_model(cfg: RunConfig):
    mcfg = GPT2Config(vocab_size=cfg.vocab, n_positions=cfg.seq_len, n_embd=32, n_layer=2, n_head=2,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, dtype=cfg.model_dtype)
    return AutoModelForCausalLM.from_config(mcfg, dtype=getattr(torch, mcfg.dtype) if isinstance(mcfg.dtype, str) else mcfg.dtype)


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    set_seed(0)
    model = build_model(cfg)
    args = TrainingArguments(
        output_dir=cfg.out_dir, per_device_train_batch_size=cfg.per_device_batch,
        gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.lr, num_train_epochs=2,
        lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.0, max_grad_norm=1.0,
        bf16=True, use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no",
        logging_steps=100, seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=SyntheticSFT(cfg))
    trainer.train()
    if trainer.args.process_index == 0:
        print("optimizer steps:", trainer.state.global_step)
        print("FINAL_SHA256", digest(trainer.model))


if __name__ == "__main__":
    main()
