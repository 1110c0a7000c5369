"""Bradley-Terry reward model on a LoRA adapter (score head saved in full), Accelerate.

A small trainer class in the style of TRL's RewardTrainer: a pair collator that right-pads
chosen and rejected answers into one batch, a pairwise loss, and a clipped AdamW step.
"""
import argparse
import hashlib
import random

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, TaskType, get_peft_model
from transformers import LlamaConfig, LlamaForSequenceClassification, get_cosine_schedule_with_warmup

PAD = 0
DEFAULTS = dict(lr=2e-3, grad_accum=3, per_device_pairs=4, max_steps=8, max_grad_norm=0.05,
                warmup=2, seed=77)


class PreferencePairs(Dataset):
    def __init__(self, n, seed):
        g = random.Random(seed)
        self.rows = []
        for _ in range(n):
            prompt = [g.randrange(3, 64) for _ in range(g.randrange(2, 6))]
            good = [g.randrange(3, 32) for _ in range(g.randrange(2, 9))]
            bad = [g.randrange(32, 64) for _ in range(g.randrange(2, 9))]
            self.rows.append((prompt + good, prompt + bad))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def pair_collator(rows):
    seqs = [c for c, _ in rows] + [r for _, r in rows]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask, "n_pairs": len(rows)}


class RewardTrainer:
    def __init__(self, args, accelerator, model, optimizer, scheduler, loader):
        self.args, self.acc = args, accelerator
        self.model, self.optimizer, self.scheduler, self.loader = model, optimizer, scheduler, loader
        self.global_step = 0

    def compute_loss(self, batch):
        rewards = self.model(input_ids=batch["input_ids"],
                             attention_mask=batch["attention_mask"]).logits.squeeze(-1)
        n = batch["n_pairs"]
        return -F.logsigmoid(rewards[:n] - rewards[n:]).mean()

    def _clip(self):
        if self.acc.sync_gradients and self.args.max_grad_norm:
            self.acc.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)

    def training_step(self, batch):
        with self.acc.accumulate(self.model):
            loss = self.compute_loss(batch)
            self.acc.backward(loss)
            self._clip()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        return loss.detach()

    def train(self):
        self.model.train()
        while self.global_step < self.args.max_steps:
            for batch in self.loader:
                self.training_step(batch)
                if self.acc.sync_gradients:
                    self.global_step += 1
                    if self.global_step >= self.args.max_steps:
                        break


def fingerprint(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    for k, v in DEFAULTS.items():
        ap.add_argument(f"--{k}", type=type(v), default=v)
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()

    acc = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
    set_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    base = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=PAD, num_labels=1))
    model = get_peft_model(base, LoraConfig(task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8,
                                            lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=args.lr, weight_decay=0.0)
    # the prepared scheduler is stepped once per process at each real step
    scheduler = get_cosine_schedule_with_warmup(optimizer, args.warmup * acc.num_processes,
                                                args.max_steps * acc.num_processes)
    n_pairs = args.max_steps * args.grad_accum * args.per_device_pairs * acc.num_processes
    loader = DataLoader(PreferencePairs(n_pairs, 5), batch_size=args.per_device_pairs,
                        shuffle=False, collate_fn=pair_collator)
    model, optimizer, scheduler, loader = acc.prepare(model, optimizer, scheduler, loader)

    RewardTrainer(args, acc, model, optimizer, scheduler, loader).train()

    net = acc.unwrap_model(model)
    if acc.is_main_process:
        if args.dump:
            torch.save({n: p.detach().float().clone() for n, p in net.named_parameters()}, args.dump)
        print(f"FINAL_SHA256 {fingerprint(net)}")
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
