# corpus: style=trainer class=OK
"""Checkpoint/resume with the settings as plain class attributes; checkpoints on window
boundaries only (every 8 micro-batches, K = 4)."""
import torch


class Cfg:
    micro_bs, accum = 16, 4
    ckpt_every = 8
    lr = 3e-4


class Runner:
    def __init__(self, model, cfg, path):
        self.model, self.cfg, self.path = model, cfg, path
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.seen = 0

    def resume(self):
        ck = torch.load(self.path)
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["opt"])
        self.seen = ck["seen"]

    def fit(self, batches):
        for i, (x, y) in enumerate(batches):
            if i < self.seen:
                continue
            loss = torch.nn.functional.mse_loss(self.model(x), y) / self.cfg.accum
            loss.backward()
            self.seen = i + 1
            if self.seen % self.cfg.accum == 0:
                self.opt.step()
                self.opt.zero_grad()
            if self.seen % self.cfg.ckpt_every == 0:
                torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                            "seen": self.seen}, self.path)
