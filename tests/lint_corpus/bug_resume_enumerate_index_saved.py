# corpus: style=trainer_class class=F13
# the checkpoint at the boundary stores the enumerate index of the last micro-batch (a
# position) where the resume expects the number consumed: the resumed run re-reads one
# micro-batch and steps after a window of one
import itertools

import torch


class Seq2SeqTrainer:
    def __init__(self, model, opt, sched, cfg, path):
        self.model, self.opt, self.sched, self.cfg, self.path = model, opt, sched, cfg, path
        self.resume_from = 0

    def checkpoint(self, position):
        torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                    "position": position}, self.path)

    def restore(self):
        state = torch.load(self.path)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.resume_from = state["position"]  # expect: AG150

    def fit(self, batches):
        stream = itertools.islice(iter(batches), self.resume_from, None)
        for position, batch in enumerate(stream, start=self.resume_from):
            (self.model(**batch).loss / self.cfg.grad_accum_steps).backward()
            if (position + 1) % self.cfg.grad_accum_steps == 0:
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad()
                self.checkpoint(position)
