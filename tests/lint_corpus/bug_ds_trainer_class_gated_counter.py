# corpus: style=trainer_class class=F14
# a trainer class counts micro-batches itself and steps the engine every `accum` of them, with
# the loss undivided (left to DeepSpeed's 1/GA); the config is loaded from a path in the
# trainer's options, out of sight
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

    def train_epoch(self, loader):
        for x, y in loader:
            loss = self.criterion(self.engine(x), y)
            self.engine.backward(loss)
            self.micro += 1
            if self.micro % self.accum == 0:
                self.engine.step()  # expect: AG110
