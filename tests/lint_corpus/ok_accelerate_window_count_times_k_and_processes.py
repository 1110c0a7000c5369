# corpus: style=accelerate_tokens class=OK
import torch
import torch.nn.functional as F
from accelerate import Accelerator


class Trainer:
    def __init__(self, model, loader, cfg):
        self.accelerator = Accelerator(gradient_accumulation_steps=cfg.accum)
        self.cfg = cfg
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)

    def summed_loss(self, batch):
        logits = self.model(batch["input_ids"])
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")

    def fit(self):
        it = iter(self.loader)
        for _ in range(self.cfg.updates):
            micro = [next(it) for _ in range(self.cfg.accum)]
            tokens = sum(int((b["labels"] != -100).sum()) for b in micro)
            tokens = self.accelerator.gather(torch.tensor(tokens)).sum()
            for batch in micro:
                with self.accelerator.accumulate(self.model):
                    scale = self.cfg.accum * self.accelerator.num_processes
                    loss = self.summed_loss(batch) * scale / tokens
                    self.accelerator.backward(loss)
                    self.opt.step()
                    self.opt.zero_grad()
