# corpus: style=trainer_class class=OK
# a trainer class whose window passes the window's token count to the model call inline
# in the backward: HF divides the summed loss by it, the window's normalisation
from dataclasses import dataclass

import torch


@dataclass
class Cfg:
    accumulation_steps: int = 4
    lr: float = 1e-4


class Trainer:
    def __init__(self, model, loader, cfg: Cfg):
        self.model = model
        self.loader = loader
        self.cfg = cfg
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def window_tokens(self, micro_batches):
        return sum(int((mb["labels"][:, 1:] != -100).sum()) for mb in micro_batches)

    def train_step(self, micro_batches):
        n_tokens = self.window_tokens(micro_batches)
        for mb in micro_batches:
            self.model(input_ids=mb["input_ids"], labels=mb["labels"],
                       num_items_in_batch=n_tokens).loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def fit(self):
        buf = []
        for i, batch in enumerate(self.loader):
            buf.append(batch)
            if len(buf) == self.cfg.accumulation_steps:
                self.train_step(buf)
                buf = []
