# corpus: style=deepspeed class=LOSS_SCALE
# The engine's documented loop in a helper: backward and step every micro-batch, and the
# loss divided by K by hand as well.
import deepspeed
import torch.nn.functional as F

GA = 4
CONFIG = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": GA,
          "gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}


def train_step(engine, x, y):
    loss = F.mse_loss(engine(x), y)
    loss = loss / GA
    engine.backward(loss)  # expect: AG134
    engine.step()


def main(model, opt, batches):
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=CONFIG)
    for step in range(10):
        for k in range(GA):
            x, y = batches[step * GA + k]
            train_step(engine, x, y)
