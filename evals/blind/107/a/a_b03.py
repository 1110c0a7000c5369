"""DPO on a LoRA adapter with Accelerate; the reference policy is the base model
(adapter switched off), as TRL does for PEFT models.

The collator drops pairs whose prompt + answer is longer than `max_length` (TRL's
truncation mode "drop"), so micro-batches carry 1 to 4 pairs. The objective is the mean
DPO loss over all pairs of an optimizer step.
"""
import argparse
import hashlib
import random
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

PAD = 0
cfg = SimpleNamespace(beta=0.1, lr=3e-3, grad_accum=4, per_device_pairs=4, max_length=10,
                      windows=6, seed=2024)


class Pairs(Dataset):
    def __init__(self, n, seed):
        g = random.Random(seed)
        self.rows = []
        for i in range(n):
            long_ok = i % 4 != 0          # first pair of every batch is always short
            p = [g.randrange(3, 64) for _ in range(g.randrange(2, 5))]
            hi = 12 if long_ok else 6
            c = [g.randrange(3, 64) for _ in range(g.randrange(2, hi))]
            r = [g.randrange(3, 64) for _ in range(g.randrange(2, hi))]
            self.rows.append((p, c, r))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class DropLongPairsCollator:
    def __init__(self, max_length):
        self.max_length = max_length

    def _pad(self, seqs, prompt_lens):
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
        mask = torch.zeros_like(ids)
        loss_mask = torch.zeros_like(ids)
        for i, (s, pl) in enumerate(zip(seqs, prompt_lens)):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
            loss_mask[i, pl: len(s)] = 1
        return ids, mask, loss_mask

    def __call__(self, rows):
        keep = [(p, c, r) for p, c, r in rows
                if len(p) + max(len(c), len(r)) <= self.max_length]
        seqs = [p + c for p, c, _ in keep] + [p + r for p, _, r in keep]
        plens = [len(p) for p, _, _ in keep] * 2
        ids, mask, loss_mask = self._pad(seqs, plens)
        return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask,
                "n_pairs": torch.tensor(len(keep))}


def sequence_logps(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].float()
    tgt = batch["input_ids"][:, 1:]
    lm = batch["loss_mask"][:, 1:].float()
    tok = torch.gather(logits.log_softmax(-1), 2, tgt.unsqueeze(-1)).squeeze(-1)
    return (tok * lm).sum(-1)


def dpo_losses(model, peft_model, batch, beta):
    n = int(batch["n_pairs"])
    pol = sequence_logps(model, batch)
    with torch.no_grad(), peft_model.disable_adapter():
        ref = sequence_logps(model, batch)
    margin = (pol[:n] - ref[:n]) - (pol[n:] - ref[n:])
    return -F.logsigmoid(beta * margin)


def fingerprint(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default=None)
    cli = ap.parse_args()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)
    K, W = cfg.grad_accum, acc.num_processes

    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=PAD))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    n = cfg.windows * K * W * cfg.per_device_pairs
    loader = DataLoader(Pairs(n, 99), batch_size=cfg.per_device_pairs, shuffle=False,
                        collate_fn=DropLongPairsCollator(cfg.max_length))
    model, opt, loader = acc.prepare(model, opt, loader)

    # pairs that survive the collator, per optimizer step over all ranks (for the log)
    kept = torch.stack([b["n_pairs"] for b in loader])
    window_pairs = acc.gather(kept).view(W, -1, K).sum(dim=(0, 2)).float()
    acc.print("pairs per step:", window_pairs.tolist())

    peft_model = acc.unwrap_model(model)
    model.train()
    step = 0
    for batch in loader:
        with acc.accumulate(model):
            losses = dpo_losses(model, peft_model, batch, cfg.beta)
            loss = losses.mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            step += 1

    net = acc.unwrap_model(model)
    if acc.is_main_process:
        if cli.dump:
            torch.save({k: p.detach().float().clone() for k, p in net.named_parameters()}, cli.dump)
        print(f"FINAL_SHA256 {fingerprint(net)}")
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
