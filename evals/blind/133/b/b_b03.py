"""Captioning-style SFT of a tiny "vision-language" model with the HF Trainer.

Each example carries a feature vector that is projected into a 2-token prefix; the text
after the prefix is a prompt (masked) followed by the caption (trained on).
"""
import argparse
import hashlib
import os

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB = 80
FEAT_DIM = 16
N_PREFIX = 2


class PrefixLlama(LlamaForCausalLM):
    """LlamaForCausalLM with a learned projection of image features into prefix embeddings."""

    accepts_loss_kwargs = False  # as in Qwen2.5-VL / Glm4v: let the Trainer handle the loss scaling

    def __init__(self, config):
        super().__init__(config)
        self.feat_proj = nn.Linear(FEAT_DIM, N_PREFIX * config.hidden_size)

    def forward(self, input_ids=None, attention_mask=None, labels=None, pixel_feats=None, **kwargs):
        tok = self.get_input_embeddings()(input_ids)
        prefix = self.feat_proj(pixel_feats).view(tok.size(0), N_PREFIX, -1)
        embeds = torch.cat([prefix, tok], dim=1)
        ones = attention_mask.new_ones(attention_mask.size(0), N_PREFIX)
        attention_mask = torch.cat([ones, attention_mask], dim=1)
        if labels is not None:
            pad = labels.new_full((labels.size(0), N_PREFIX), -100)
            labels = torch.cat([pad, labels], dim=1)
        return super().forward(inputs_embeds=embeds, attention_mask=attention_mask, labels=labels, **kwargs)


class CaptionData(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            p_len = int(torch.randint(2, 12, (1,), generator=g))
            c_len = int(torch.randint(1, 14, (1,), generator=g))
            ids = torch.randint(3, VOCAB, (1 + p_len + c_len,), generator=g)
            ids[0] = 1  # BOS
            labels = ids.clone()
            labels[: 1 + p_len] = -100  # BOS and prompt are not trained on
            feats = torch.randn(FEAT_DIM, generator=g)
            self.items.append((ids, labels, feats))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        ids, labels, feats = self.items[i]
        return {"input_ids": ids, "labels": labels, "pixel_feats": feats}


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    out = {
        "input_ids": torch.zeros(len(features), width, dtype=torch.long),
        "attention_mask": torch.zeros(len(features), width, dtype=torch.long),
        "labels": torch.full((len(features), width), -100, dtype=torch.long),
        "pixel_feats": torch.stack([f["pixel_feats"] for f in features]),
    }
    for r, f in enumerate(features):
        n = len(f["input_ids"])
        out["input_ids"][r, :n] = f["input_ids"]
        out["attention_mask"][r, :n] = 1
        out["labels"][r, :n] = f["labels"]
    return out


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--samples", type=int, default=160)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b03_out"))
    return ap.parse_args()


def main():
    a = parse_args()
    set_seed(a.seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = PrefixLlama(cfg)
    args = TrainingArguments(
        output_dir=a.out, per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=a.grad_accum,
        num_train_epochs=a.epochs, learning_rate=a.lr, lr_scheduler_type="linear", warmup_steps=2,
        weight_decay=0.0, max_grad_norm=0.0, logging_steps=1000, save_strategy="no", report_to=[],
        use_cpu=True, ddp_backend="gloo", seed=a.seed, data_seed=a.seed, disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=CaptionData(a.samples, a.seed), data_collator=collate)
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
