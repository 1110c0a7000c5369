"""Chat SFT on a LoRA adapter plus a fully trained copy of the LM head (`modules_to_save`),
Accelerate with bf16 autocast, two optimizers (AdamW for the adapter, SGD with momentum for
the head), a worker DataLoader sharded by hand and windows of K micro-batches read ahead so
the loss can be a token mean over the whole window on all ranks.
"""
import argparse
import hashlib
import random

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

PAD = 0
USER, ASSISTANT = 1, 2


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--micro-bs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches-per-rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--head-lr", type=float, default=5e-2)
    ap.add_argument("--seed", type=int, default=4)
    return ap.parse_args()


class Chats(Dataset):
    def __init__(self, n, seed):
        g = random.Random(seed)
        self.rows = []
        for _ in range(n):
            turns = []
            for _ in range(g.randrange(1, 3)):
                turns.append((USER, [g.randrange(3, 80) for _ in range(g.randrange(1, 5))]))
                turns.append((ASSISTANT, [g.randrange(3, 80) for _ in range(g.randrange(1, 6))]))
            self.rows.append(turns)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class AssistantOnlyCollator:
    """Labels only on assistant tokens; left to right, right padded."""

    def __call__(self, rows):
        seqs, labs = [], []
        for turns in rows:
            s, l = [], []
            for role, toks in turns:
                s += [role] + toks
                l += [-100] + (toks if role == ASSISTANT else [-100] * len(toks))
            seqs.append(s)
            labs.append(l)
        width = max(map(len, seqs))
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        am = torch.zeros_like(ids)
        for i, (s, l) in enumerate(zip(seqs, labs)):
            ids[i, : len(s)] = torch.tensor(s)
            labels[i, : len(l)] = torch.tensor(l)
            am[i, : len(s)] = 1
        return {"input_ids": ids, "attention_mask": am, "labels": labels}


def fingerprint(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = get_args()
    acc = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=args.grad_accum)
    set_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    K, W, rank = args.grad_accum, acc.num_processes, acc.process_index

    base = GPT2LMHeadModel(GPT2Config(vocab_size=80, n_positions=64, n_embd=32, n_layer=2,
                                      n_head=2, tie_word_embeddings=False))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["c_attn", "c_fc"],
                                            fan_in_fan_out=True, modules_to_save=["lm_head"]))
    head = [p for n, p in model.named_parameters() if p.requires_grad and "modules_to_save" in n]
    lora = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    opt_lora = torch.optim.AdamW(lora, lr=args.lr)
    opt_head = torch.optim.SGD(head, lr=args.head_lr, momentum=0.9)
    model, opt_lora, opt_head = acc.prepare(model, opt_lora, opt_head)

    nb = args.batches_per_rank * W
    data = Chats(nb * args.micro_bs, 21)
    mine = [j for b in range(rank, nb, W) for j in range(b * args.micro_bs, (b + 1) * args.micro_bs)]
    loader = DataLoader(Subset(data, mine), batch_size=args.micro_bs, shuffle=False,
                        num_workers=1, collate_fn=AssistantOnlyCollator())

    model.train()
    updates = 0
    for epoch in range(args.epochs):
        it = iter(loader)
        for _ in range(args.batches_per_rank // K):
            window = [next(it) for _ in range(K)]
            n_lab = torch.tensor(float(sum((b["labels"][:, 1:] != -100).sum() for b in window)))
            n_lab = acc.reduce(n_lab, reduction="sum")
            for b in window:
                with acc.accumulate(model):
                    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                    tok = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                          b["labels"][:, 1:].reshape(-1), ignore_index=-100,
                                          reduction="sum")
                    # backward() divides by K and DDP by W: undo both
                    acc.backward(tok * K * W / n_lab)
                    opt_lora.step()
                    opt_head.step()
                    opt_lora.zero_grad()
                    opt_head.zero_grad()
            updates += 1
    acc.print(f"updates: {updates}")

    net = acc.unwrap_model(model)
    if acc.is_main_process:
        print(f"FINAL_SHA256 {fingerprint(net)}")
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
