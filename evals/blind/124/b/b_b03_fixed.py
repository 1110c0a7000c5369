"""Offline REINFORCE-with-baseline on a LoRA policy (TRL-style), Accelerate, two models.

policy: tiny GPT-2 with a LoRA adapter; critic: a small bag-of-tokens value net with its own
optimizer. Rewards are fixed per sequence (a synthetic offline buffer).
"""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=12)
    ap.add_argument("--buffer-size", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--policy-lr", type=float, default=5e-3)
    ap.add_argument("--value-lr", type=float, default=1e-2)
    return ap.parse_args()


class ValueNet(nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, 1))

    def forward(self, ids):
        return self.mlp(self.emb(ids)).squeeze(-1)


def seq_logprob(policy, ids):
    logits = policy(input_ids=ids).logits[:, :-1]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).sum(-1)


class RLTrainer:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
        assert self.accelerator.num_processes == 2
        set_seed(args.seed)
        base = GPT2LMHeadModel(GPT2Config(vocab_size=args.vocab, n_positions=32, n_embd=32,
                                          n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                          attn_pdrop=0.0))
        policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                 target_modules=["c_attn", "c_proj"],
                                                 fan_in_fan_out=True))
        value = ValueNet(args.vocab)
        g = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, args.vocab, (args.buffer_size, args.seq_len), generator=g)
        rewards = torch.randn(args.buffer_size, generator=g)
        loader = DataLoader(TensorDataset(ids, rewards), batch_size=args.micro_batch, shuffle=False)
        p_opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad],
                                  lr=args.policy_lr, weight_decay=0.0)
        v_opt = torch.optim.AdamW(value.parameters(), lr=args.value_lr, weight_decay=0.0)
        (self.policy, self.value, self.p_opt, self.v_opt, self.loader) = self.accelerator.prepare(
            policy, value, p_opt, v_opt, loader)

    def micro_step(self, ids, rewards):
        acc = self.accelerator
        with acc.accumulate(self.policy, self.value):
            v = self.value(ids)
            adv = (rewards - v).detach()
            pg_loss = -(adv * seq_logprob(self.policy, ids)).mean()
            v_loss = F.mse_loss(v, rewards)
            acc.backward(pg_loss + 0.5 * v_loss)
            self.p_opt.step()
            self.v_opt.step()
            self.p_opt.zero_grad()
            self.v_opt.zero_grad()

    def fit(self):
        self.policy.train()
        self.value.train()
        for _ in range(self.args.epochs):
            for ids, rewards in self.loader:
                self.micro_step(ids, rewards)


def param_sha(*modules):
    h = hashlib.sha256()
    for m in modules:
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    trainer = RLTrainer(parse())
    trainer.fit()
    acc = trainer.accelerator
    if acc.is_main_process:
        sha = param_sha(acc.unwrap_model(trainer.policy), acc.unwrap_model(trainer.value))
        print(f"FINAL_SHA256 {sha}", flush=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
