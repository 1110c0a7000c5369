"""Bradley-Terry reward model, TRL RewardTrainer style, on Accelerate with bf16 autocast.

The LoRA backbone and the scalar value head are separate modules prepared apart,
each with its own optimizer (AdamW for LoRA, SGD with momentum for the head).
Only the head is passed to `accumulate()`: the backbone's DDP then all-reduces on
every micro-batch, which costs bandwidth but sums to the same gradient.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import LlamaConfig, LlamaModel
from peft import LoraConfig, get_peft_model


@dataclass
class RMConfig:
    seed: int = 21
    micro_batch: int = 2
    grad_accum: int = 3
    epochs: int = 3
    n_pairs: int = 24
    seq: int = 10
    lr_lora: float = 2e-3
    lr_head: float = 5e-2


class Pairs(Dataset):
    def __init__(self, c: RMConfig, vocab):
        g = torch.Generator().manual_seed(c.seed)
        self.data = []
        for _ in range(c.n_pairs):
            row = []
            for _ in range(2):
                n = int(torch.randint(4, c.seq + 1, (1,), generator=g))
                ids = torch.zeros(c.seq, dtype=torch.long)
                ids[:n] = torch.randint(3, vocab, (n,), generator=g)
                mask = (torch.arange(c.seq) < n).long()
                row += [ids, mask]
            self.data.append(tuple(row))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class ValueHead(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.dropout = nn.Identity()
        self.summary = nn.Linear(hidden, 1)

    def forward(self, h):
        return self.summary(self.dropout(h)).squeeze(-1)


def rewards(backbone, head, ids, mask):
    h = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    last = mask.sum(-1) - 1
    return head(h[torch.arange(ids.shape[0]), last].float())


def main():
    c = RMConfig()
    torch.use_deterministic_algorithms(True)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=c.grad_accum)
    set_seed(c.seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    backbone = get_peft_model(LlamaModel(cfg), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                          target_modules=["q_proj", "v_proj", "o_proj"],
                                                          init_lora_weights="gaussian"))
    head = ValueHead(cfg.hidden_size)
    opt_lora = torch.optim.AdamW([p for p in backbone.parameters() if p.requires_grad], lr=c.lr_lora)
    opt_head = torch.optim.SGD(head.parameters(), lr=c.lr_head, momentum=0.9)
    loader = DataLoader(Pairs(c, cfg.vocab_size), batch_size=c.micro_batch, shuffle=False)
    backbone, opt_lora, loader = accelerator.prepare(backbone, opt_lora, loader)
    head, opt_head = accelerator.prepare(head, opt_head)

    for epoch in range(c.epochs):
        backbone.train()
        head.train()
        for ch_ids, ch_mask, rj_ids, rj_mask in loader:
            with accelerator.accumulate(head):
                with accelerator.autocast():
                    r = rewards(backbone, head, torch.cat([ch_ids, rj_ids]), torch.cat([ch_mask, rj_mask]))
                n = ch_ids.shape[0]
                loss = -F.logsigmoid(r[:n] - r[n:]).mean()
                accelerator.backward(loss)
                opt_lora.step()
                opt_head.step()
                opt_lora.zero_grad()
                opt_head.zero_grad()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        params = list(accelerator.unwrap_model(backbone).named_parameters()) + \
            list(accelerator.unwrap_model(head).named_parameters())
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in params])
        if os.environ.get("DUMP_PARAMS"):
            torch.save(flat, os.environ["DUMP_PARAMS"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    accelerator.end_training()


if __name__ == "__main__":
    main()
