# corpus: style=plain class=F5
"""The per-micro-batch token mean comes from a helper of the file (ignore_index masks the
prompts), then the loop divides it by K: micro-batches with few tokens weigh more."""
import torch
import torch.nn.functional as F

IGNORE = -100
ACCUM = 4


def lm_loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


def train(batches):
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(1000):
        for micro in range(ACCUM):
            ids, labels = next(batches)
            loss = lm_loss(model(ids), labels) / ACCUM  # expect: AG104
            loss.backward()
        opt.step()
        opt.zero_grad()
