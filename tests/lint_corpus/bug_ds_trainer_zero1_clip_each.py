# corpus: style=trainer_class class=F8
# a trainer class on ZeRO-1 (GA 4 in its dict config) clips by hand every micro-batch
import deepspeed
import torch


class Trainer:
    def __init__(self, model, data):
        cfg = {
            "train_batch_size": 32,
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 4,
            "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 1},
        }
        self.engine, self.opt, self.loader, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), training_data=data, config=cfg
        )

    def train_epoch(self):
        for batch in self.loader:
            out = self.engine(**batch)
            self.engine.backward(out.loss)
            torch.nn.utils.clip_grad_norm_(self.engine.module.parameters(), max_norm=1.0)  # expect: AG105
            self.engine.step()
