"""Pairwise reward-model training (TRL RewardTrainer-style loss) with Accelerate.

2 ranks, GA 2, each rank sees 5 micro-batches of 2 preference pairs per epoch,
so every epoch is windows of 2, 2 and 1 micro-batches.  The objective is the
mean Bradley-Terry loss over the pairs of each optimizer step.
"""
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForSequenceClassification


@dataclass
class RMConfig:
    n_pairs: int = 20
    seq_len: int = 16
    vocab: int = 64
    batch_size: int = 2
    grad_accum: int = 2
    epochs: int = 3
    lr: float = 2e-3
    seed: int = 11


class PairData(Dataset):
    def __init__(self, c: RMConfig):
        g = torch.Generator().manual_seed(c.seed)
        self.chosen = torch.randint(3, c.vocab, (c.n_pairs, c.seq_len), generator=g)
        self.rejected = torch.randint(3, c.vocab, (c.n_pairs, c.seq_len), generator=g)

    def __len__(self):
        return len(self.chosen)

    def __getitem__(self, i):
        return {"chosen": self.chosen[i], "rejected": self.rejected[i]}


def bt_loss(model, batch):
    both = torch.cat([batch["chosen"], batch["rejected"]], dim=0)
    rewards = model(input_ids=both).logits.squeeze(-1)
    r_c, r_r = rewards.chunk(2)
    return -F.logsigmoid(r_c - r_r).mean()


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    c = RMConfig()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=c.grad_accum)
    assert acc.num_processes == 2
    set_seed(c.seed)
    mcfg = LlamaConfig(vocab_size=c.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                       num_labels=1, pad_token_id=0)
    model = LlamaForSequenceClassification(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.0)
    loader = DataLoader(PairData(c), batch_size=c.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(c.seed))
    model, opt, loader = acc.prepare(model, opt, loader)
    steps_per_epoch = math.ceil(len(loader) / c.grad_accum)
    total = steps_per_epoch * c.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))

    model.train()
    for epoch in range(c.epochs):
        for step, batch in enumerate(loader):
            with acc.accumulate(model):
                loss = bt_loss(model, batch)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            if acc.sync_gradients:
                sched.step()

    if acc.is_main_process:
        m = acc.unwrap_model(model)
        print(f"FINAL_SHA256 {sha_of(m)}", flush=True)
        torch.save({n: p.detach().clone() for n, p in m.named_parameters()},
                   os.path.join("tmp_scratch", os.path.basename(__file__).replace(".py", ".pt")))


if __name__ == "__main__":
    main()
