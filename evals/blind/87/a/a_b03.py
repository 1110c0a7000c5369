"""Lightning Fabric, 2 DDP ranks on CPU: a small sequence tagger trained with gradient accumulation."""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric

SEED = 11
VOCAB, N_TAGS, SEQ = 50, 6, 12
MICRO_BS, ACCUM, STEPS = 4, 4, 8
LR, MAX_NORM = 3e-3, 0.05


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.rnn = nn.GRU(32, 32, batch_first=True)
        self.out = nn.Linear(32, N_TAGS)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.out(h)


class FabricTagTrainer:
    def __init__(self):
        self.fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
        self.fabric.launch()
        self.fabric.seed_everything(SEED)
        model = Tagger()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        self.model, self.opt = self.fabric.setup(model, opt)
        g = torch.Generator().manual_seed(SEED + 100 + self.fabric.global_rank)
        n = MICRO_BS * ACCUM * STEPS
        self.tokens = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.tags = (self.tokens * 7 + torch.roll(self.tokens, 1, dims=1)) % N_TAGS

    def micro_batches(self, step):
        base = step * ACCUM * MICRO_BS
        for k in range(ACCUM):
            s = base + k * MICRO_BS
            yield k, self.tokens[s:s + MICRO_BS], self.tags[s:s + MICRO_BS]

    def _backward(self, loss):
        self.fabric.backward(loss)
        self.fabric.clip_gradients(self.model, self.opt, max_norm=MAX_NORM)

    def _optimizer_step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self):
        self.model.train()
        for step in range(STEPS):
            for k, x, y in self.micro_batches(step):
                is_accumulating = k < ACCUM - 1
                with self.fabric.no_backward_sync(self.model, enabled=is_accumulating):
                    logits = self.model(x)
                    loss = F.cross_entropy(logits.reshape(-1, N_TAGS), y.reshape(-1)) / ACCUM
                    self._backward(loss)
            self._optimizer_step()
            self.fabric.print(f"step {step} loss {loss.item() * ACCUM:.4f}")

    def report(self):
        if self.fabric.global_rank == 0:
            h = hashlib.sha256()
            for _, p in self.model.module.named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
            print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    t = FabricTagTrainer()
    t.train()
    t.report()
