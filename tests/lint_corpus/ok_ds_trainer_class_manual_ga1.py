# corpus: style=trainer_class class=OK
# the same trainer for a GA = 1 config (ZeRO-0): the loop gates step() by hand and divides the
# loss by its K itself, in a helper; nothing relies on the engine's GA
import deepspeed
import torch.nn as nn


class DSTrainer:
    def __init__(self, model, opts):
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=opts.ds_config
        )
        self.criterion = nn.CrossEntropyLoss()
        self.accum = opts.accum
        self.micro = 0

    def micro_loss(self, x, y):
        return self.criterion(self.engine(x), y) / self.accum

    def train_epoch(self, loader):
        for x, y in loader:
            loss = self.micro_loss(x, y)
            self.engine.backward(loss)
            self.micro += 1
            if self.micro % self.accum == 0:
                self.engine.step()  # expect: AG139
