# corpus: style=deepspeed class=F14
import deepspeed
import torch
import torch.nn.functional as F

GAS = 8


def build_config(gas, micro=4):
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "zero_optimization": {"stage": 1},
    }


class Runner:
    def __init__(self, model):
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=build_config(GAS)
        )

    def train(self, loader):
        for i, (x, y) in enumerate(loader):
            loss = F.cross_entropy(self.engine(x), y)
            self.engine.backward(loss)
            if (i + 1) % GAS == 0:
                self.engine.step()  # expect: AG110
