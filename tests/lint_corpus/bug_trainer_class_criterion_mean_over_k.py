# corpus: style=trainer_class class=F5
# a trainer class builds a token criterion with ignore_index in __init__ (a mean over the
# micro-batch's real tokens) and its loop divides it by K: a mean of per-micro-batch means
import torch
import torch.nn as nn


class Trainer:
    def __init__(self, model, accum):
        self.model, self.accum = model, accum
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        self.criterion = nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)

    def compute_loss(self, b):
        logits = self.model(b["src"], b["tgt_in"])
        return self.criterion(logits.flatten(0, 1), b["tgt_out"].flatten())

    def train(self, batches):
        K = self.accum
        for i, b in enumerate(batches):
            loss = self.compute_loss(b) / K  # expect: AG104
            loss.backward()
            if (i + 1) % K == 0:
                self.opt.step()
                self.opt.zero_grad()
