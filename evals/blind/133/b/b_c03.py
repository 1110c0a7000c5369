"""Accelerate + PEFT LoRA SFT with a grown vocabulary and a window-level token loss.

Each window of K micro-batches is read ahead so the loss can be normalised by the number of
target tokens over the whole window on all ranks. `accelerator.backward` divides by K and DDP
averages over W ranks, so the summed token loss is scaled by K * W / window_tokens.
bf16 autocast through `mixed_precision="bf16"`; parameters and gradients stay fp32.
"""
import hashlib
import os

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM

SEED, BASE_VOCAB, NEW_TOKENS, K, MB = 5, 60, 8, 2, 3


class Rows(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.data = []
        for _ in range(n):
            p, c = int(torch.randint(1, 8, (1,), generator=g)), int(torch.randint(1, 16, (1,), generator=g))
            ids = torch.randint(3, BASE_VOCAB + NEW_TOKENS, (p + c,), generator=g)
            lab = ids.clone()
            lab[:p] = -100
            self.data.append((ids, lab))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def collate(rows):
    w = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), w, dtype=torch.long)
    att = torch.zeros_like(ids)
    lab = torch.full_like(ids, -100)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)], att[i, : len(x)], lab[i, : len(x)] = x, 1, y
    return ids, att, lab


def main():
    acc = Accelerator(cpu=True, mixed_precision="bf16",
                      gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False))
    assert acc.num_processes == 2
    set_seed(SEED)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=BASE_VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, pad_token_id=0, tie_word_embeddings=False))
    base.resize_token_embeddings(BASE_VOCAB + NEW_TOKENS)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0, init_lora_weights="gaussian",
                                            target_modules=["q_proj", "k_proj", "o_proj", "up_proj"],
                                            modules_to_save=["embed_tokens", "lm_head"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.0)
    # 48 rows per rank, MB 3 -> 16 micro-batches per epoch per rank -> 8 windows of K = 2
    loader = DataLoader(Rows(96), batch_size=MB, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(SEED))
    model, opt, loader = acc.prepare(model, opt, loader)
    W = acc.num_processes

    model.train()
    for _ in range(2):
        it = iter(loader)
        for _w in range(len(loader) // K):
            window = [next(it) for _ in range(K)]
            local = torch.tensor(sum(int((lab[:, 1:] != -100).sum()) for _, _, lab in window), dtype=torch.float32)
            total = acc.reduce(local, reduction="sum")
            for ids, att, lab in window:
                with acc.accumulate(model):
                    with acc.autocast():
                        logits = model(input_ids=ids, attention_mask=att).logits
                    s = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                        lab[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
                    acc.backward(s * (K * W) / total)
                    opt.step()
                    opt.zero_grad()

    flat = torch.cat([p.detach().float().reshape(-1) for _, p in acc.unwrap_model(model).named_parameters()])
    if acc.is_main_process:
        if os.environ.get("PARAM_DUMP"):
            torch.save(flat, os.environ["PARAM_DUMP"])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()}", flush=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
