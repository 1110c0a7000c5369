# corpus: style=plain class=OK
"""The helper sums the token losses; the loop divides by the window's valid-token count."""
import torch
import torch.nn.functional as F

IGNORE = -100
ACCUM = 4


def lm_loss_sum(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                           reduction="sum")


def train(batches):
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(1000):
        window = [next(batches) for _ in range(ACCUM)]
        n_tokens = sum(int((labels != IGNORE).sum()) for _, labels in window)
        for ids, labels in window:
            loss = lm_loss_sum(model(ids), labels) / n_tokens
            loss.backward()
        opt.step()
        opt.zero_grad()
