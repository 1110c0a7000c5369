"""LoRA fine-tuning of a tiny GPT-2 causal LM with Accelerate (2 ranks, GA 2).

A small trainer class owns the Accelerator, model, optimiser and loader.
"""
import argparse
import hashlib
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()


class LoraTrainer:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
        assert self.accelerator.num_processes == 2
        set_seed(args.seed)
        base = GPT2LMHeadModel(GPT2Config(vocab_size=80, n_positions=32, n_embd=32, n_layer=2, n_head=4))
        lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], lora_dropout=0.0,
                          fan_in_fan_out=True)
        self.model = get_peft_model(base, lcfg)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=args.lr, weight_decay=0.01)
        g = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, 80, (48, 20), generator=g)
        self.loader = DataLoader(TensorDataset(ids), batch_size=args.batch_size, shuffle=True,
                                 generator=torch.Generator().manual_seed(args.seed))
        self.model, self.loader, _ = self.accelerator.prepare(self.model, self.loader, self.optimizer)

    def micro_step(self, ids):
        with self.accelerator.accumulate(self.model):
            out = self.model(input_ids=ids, labels=ids)
            self.accelerator.backward(out.loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
        return out.loss.detach()

    def fit(self):
        self.model.train()
        for epoch in range(self.args.epochs):
            for (ids,) in self.loader:
                self.micro_step(ids)

    def final_sha(self):
        h = hashlib.sha256()
        for _, p in self.accelerator.unwrap_model(self.model).named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def main():
    args = parse()
    tr = LoraTrainer(args)
    tr.fit()
    if tr.accelerator.is_main_process:
        print(f"FINAL_SHA256 {tr.final_sha()}", flush=True)
        torch.save({n: p.detach().clone() for n, p in tr.accelerator.unwrap_model(tr.model).named_parameters()},
                   os.path.join("tmp_scratch", os.path.basename(__file__).replace(".py", ".pt")))


if __name__ == "__main__":
    main()
