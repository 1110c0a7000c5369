"""SFT of a LoRA adapter with a small pre-training replay stream (Accelerate).

Each SFT micro-batch is paired with one replay micro-batch; the replay term keeps the
adapter from drifting on plain language modelling. Completion-only labels come from a
custom collator; prompts have random lengths so the batches are ragged.
"""
import argparse
import hashlib
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

PAD = 0


@dataclass
class SFTRecipe:
    lr: float = 3e-3
    grad_accum: int = 4
    micro_bs: int = 2
    epochs: int = 2
    n_sft: int = 48          # 12 micro-batches per rank per epoch
    n_replay: int = 20       # 5 micro-batches per rank
    replay_weight: float = 0.3
    seed: int = 1234


class PromptCompletion(Dataset):
    def __init__(self, n, seed):
        g = random.Random(seed)
        self.rows = []
        for _ in range(n):
            p = [g.randrange(3, 64) for _ in range(g.randrange(2, 8))]
            c = [g.randrange(3, 64) for _ in range(g.randrange(3, 9))]
            self.rows.append((p, c))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class PlainText(Dataset):
    def __init__(self, n, seed):
        g = random.Random(seed)
        self.rows = [[g.randrange(3, 64) for _ in range(g.randrange(6, 14))] for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return ([], self.rows[i])


class CompletionOnlyCollator:
    """Pads to the longest row; labels are -100 on the prompt and on padding."""

    def __call__(self, rows):
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, c) in enumerate(rows):
            seq = p + c
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
            labels[i, len(p): len(seq)] = torch.tensor(c)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def per_sample_nll(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    logits = out.logits[:, :-1].float()
    tgt = batch["labels"][:, 1:]
    tok = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                          ignore_index=-100, reduction="none").view_as(tgt)
    valid = (tgt != -100).float()
    return (tok * valid).sum(1) / valid.sum(1).clamp(min=1)   # mean over each row's completion


def endless(loader):
    while True:
        for b in loader:
            yield b


def fingerprint(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", default=None)
    cli = ap.parse_args()
    cfg = SFTRecipe()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    set_seed(cfg.seed)
    torch.use_deterministic_algorithms(True)

    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=PAD))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "up_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)

    collate = CompletionOnlyCollator()
    sft_dl = DataLoader(PromptCompletion(cfg.n_sft, 7), batch_size=cfg.micro_bs,
                        shuffle=False, collate_fn=collate)
    replay_dl = DataLoader(PlainText(cfg.n_replay, 11), batch_size=cfg.micro_bs,
                           shuffle=False, collate_fn=collate)

    # the replay stream is only a regulariser: shard it by hand so it never drives the windows
    mine = [j for b in range(accelerator.process_index, cfg.n_replay // cfg.micro_bs, accelerator.num_processes)
            for j in range(b * cfg.micro_bs, (b + 1) * cfg.micro_bs)]
    replay_dl = DataLoader(Subset(replay_dl.dataset, mine), batch_size=cfg.micro_bs,
                           shuffle=False, collate_fn=collate)
    model, opt, sft_dl = accelerator.prepare(model, opt, sft_dl)
    replay = endless(replay_dl)

    model.train()
    steps = 0
    for epoch in range(cfg.epochs):
        for batch in sft_dl:
            rbatch = next(replay)
            with accelerator.accumulate(model):
                loss = per_sample_nll(model, batch).mean() \
                    + cfg.replay_weight * per_sample_nll(model, rbatch).mean()
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                steps += 1
    accelerator.print(f"optimizer steps: {steps}")

    net = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        if cli.dump:
            torch.save({n: p.detach().float().clone() for n, p in net.named_parameters()}, cli.dump)
        print(f"FINAL_SHA256 {fingerprint(net)}")
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
