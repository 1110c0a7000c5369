# corpus: style=trainer_class class=F5
# a trainer class on Accelerate: the loss ignores pad tokens (a mean over this micro-batch's
# real tokens) and accelerator.backward divides it by K
import torch.nn as nn
from accelerate import Accelerator


class Seq2SeqTrainer:
    def __init__(self, model, optimizer, loader, pad_token_id, accum=4):
        self.accelerator = Accelerator(gradient_accumulation_steps=accum)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(model, optimizer, loader)
        self.criterion = nn.CrossEntropyLoss(ignore_index=pad_token_id)

    def train_epoch(self):
        for src, tgt in self.loader:
            with self.accelerator.accumulate(self.model):
                logits = self.model(src, tgt[:, :-1])
                loss = self.criterion(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1))
                self.accelerator.backward(loss)  # expect: AG104
                self.optimizer.step()
                self.optimizer.zero_grad()
