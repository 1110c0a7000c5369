# corpus: style=trainer_class class=OK
# the window hook steps after every window the loop ran
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
        self.opt.step()
        self.opt.zero_grad()

    def fit(self, windows):
        for window in windows:
            for x, y in window:
                self.micro(x, y)
            self.after_window()
