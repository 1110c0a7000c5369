# corpus: style=deepspeed class=F14
import deepspeed


class Runner:
    def __init__(self, args, model):
        self.engine, self.opt, _, _ = deepspeed.initialize(args=args, model=model)

    def train_step(self, batch):
        k = int(self.engine.gradient_accumulation_steps())
        for micro in batch.chunk(k):
            self.engine.backward(self.engine(micro).mean())
        self.engine.step()  # expect: AG110
