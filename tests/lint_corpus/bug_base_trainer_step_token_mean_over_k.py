# corpus: style=trainer class=F5
"""A small HF-like trainer: the loop in `train` calls `training_step` per micro-batch; the
loss is the micro-batch's token mean (padding ignored), divided by the accumulation steps."""
import torch
import torch.nn.functional as F

PAD = -100


class Trainer:
    def __init__(self, model, loader, accum_steps):
        self.model = model
        self.loader = loader
        self.accum_steps = accum_steps
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def training_step(self, batch):
        logits = self.model(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=PAD)
        loss = loss / self.accum_steps  # expect: AG104
        loss.backward()
        return loss.detach()

    def train(self):
        for step, batch in enumerate(self.loader):
            self.training_step(batch)
            if (step + 1) % self.accum_steps == 0:
                self.opt.step()
                self.opt.zero_grad()
