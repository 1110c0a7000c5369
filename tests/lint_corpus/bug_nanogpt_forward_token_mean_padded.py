# corpus: style=nanogpt class=F5
import torch
import torch.nn as nn
import torch.nn.functional as F

gradient_accumulation_steps = 8


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)
        return logits, loss


def get_batch(lengths):
    x = torch.randint(0, 64, (4, 16))
    y = torch.roll(x, -1, 1)
    pos = torch.arange(16)[None, :]
    return x, y.masked_fill(pos >= lengths[:, None], -100)


def train(model, optimizer, max_iters):
    for it in range(max_iters):
        for micro_step in range(gradient_accumulation_steps):
            X, Y = get_batch(torch.randint(2, 16, (4,)))
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # expect: AG104
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
