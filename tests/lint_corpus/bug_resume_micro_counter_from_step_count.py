# corpus: style=trainer_class class=F13
# the resume sets the micro-batch counter from the optimizer-step count (no factor K)
import torch


class Trainer:
    def __init__(self, model, opt, accum):
        self.model, self.opt, self.accum = model, opt, accum
        self.step, self.micro = 0, 0

    def load(self, path):
        state = torch.load(path)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.step = state["step"]
        self.micro = self.step  # expect: AG150

    def fit(self, batches):
        for x, y in batches[self.step * self.accum:]:
            (torch.nn.functional.mse_loss(self.model(x), y) / self.accum).backward()
            if (self.micro + 1) % self.accum == 0:
                self.opt.step()
                self.opt.zero_grad()
                self.step += 1
            self.micro += 1
