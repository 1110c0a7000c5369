# corpus: style=trainer_class class=F14
# the fit loop runs each window's K micro-batches, then the window hook steps only every K
# windows by its own counter: the step is gated twice
import torch


class Trainer:
    def __init__(self, model, grad_accum=4):
        self.model = model
        self.grad_accum = grad_accum
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.done_windows = 0

    def micro(self, x, y):
        (torch.nn.functional.mse_loss(self.model(x), y) / self.grad_accum).backward()

    def after_window(self):
        self.done_windows += 1
        if self.done_windows % self.grad_accum == 0:  # expect: AG194
            self.opt.step()
            self.opt.zero_grad()

    def fit(self, windows):
        for window in windows:
            for x, y in window:
                self.micro(x, y)
            self.after_window()
