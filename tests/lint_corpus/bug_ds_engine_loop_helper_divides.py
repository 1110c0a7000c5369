# corpus: style=deepspeed class=LOSS_SCALE
import deepspeed
import torch

GAS = 8
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": GAS,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 2},
}


class Task:
    def __init__(self, model):
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=DS_CONFIG)

    def loss_of(self, batch):
        out = self.engine(batch["x"])
        return torch.nn.functional.mse_loss(out, batch["y"]) / GAS

    def run(self, loader):
        for batch in loader:
            self.engine.backward(self.loss_of(batch))  # expect: AG134
            self.engine.step()
