"""Token-level LM loss under Accelerate with ragged rows.

Each accumulation window is read ahead so the loss can be normalised by the number of
supervised tokens in the whole window across all ranks (the "large batch" token mean).
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel


@dataclass
class Cfg:
    grad_accum: int = 3
    micro_bs: int = 2
    epochs: int = 2
    lr: float = 0.5
    n_rows: int = 36
    max_len: int = 20
    vocab: int = 72


class Ragged(Dataset):
    def __init__(self, cfg, seed=11):
        g = torch.Generator().manual_seed(seed)
        self.rows = [torch.randint(1, cfg.vocab, (int(torch.randint(4, cfg.max_len + 1, (1,), generator=g)),),
                                   generator=g) for _ in range(cfg.n_rows)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def pad_collate(rows):
    L = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    labels = torch.full((len(rows), L), -100, dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, :len(r)] = r
        labels[j, :len(r)] = r
    return ids, labels


class WindowedLMTrainer:
    def __init__(self, cfg: Cfg):
        self.cfg = cfg
        self.accelerator = Accelerator(
            cpu=True,
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=cfg.grad_accum,
                                                                    sync_with_dataloader=False),
        )
        assert self.accelerator.num_processes == 2
        set_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=cfg.vocab, n_positions=32, n_embd=32, n_layer=2,
                                           n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        loader = DataLoader(Ragged(cfg), batch_size=cfg.micro_bs, shuffle=True, collate_fn=pad_collate,
                            generator=torch.Generator().manual_seed(5))
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)

    def window_tokens(self, window):
        n = sum((labels[:, 1:] != -100).sum() for _, labels in window)
        return self.accelerator.gather(n.reshape(1)).sum()

    def micro_step(self, ids, labels, n_window):
        acc = self.accelerator
        with acc.accumulate(self.model):
            logits = self.model(input_ids=ids).logits[:, :-1]
            tok_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                                      ignore_index=-100, reduction="sum")
            # DDP averages over ranks and accelerator.backward divides by K: put both back
            loss = tok_sum * acc.num_processes * acc.gradient_accumulation_steps / n_window
            acc.backward(loss)
            self.opt.step()
            self.opt.zero_grad()

    def fit(self):
        K = self.cfg.grad_accum
        self.model.train()
        for _ in range(self.cfg.epochs):
            it = iter(self.loader)
            for _ in range(len(self.loader) // K):
                window = [next(it) for _ in range(K)]
                n_window = self.window_tokens(window)
                for ids, labels in window:
                    self.micro_step(ids, labels, n_window)

    def final_hash(self):
        h = hashlib.sha256()
        for _, p in self.accelerator.unwrap_model(self.model).named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    tr = WindowedLMTrainer(Cfg())
    tr.fit()
    tr.accelerator.wait_for_everyone()
    digest = tr.final_hash()
    if tr.accelerator.is_main_process:
        print("FINAL_SHA256", digest, flush=True)
    tr.accelerator.end_training()


if __name__ == "__main__":
    main()
