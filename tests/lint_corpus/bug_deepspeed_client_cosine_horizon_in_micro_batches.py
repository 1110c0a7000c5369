# corpus: style=deepspeed class=F4
import deepspeed
import torch
from torch.utils.data import DataLoader


class Runner:
    def __init__(self, model, dataset, epochs=3):
        self.epochs = epochs
        self.data = DataLoader(dataset, batch_size=2)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.lr_sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            optim, T_max=epochs * len(self.data))  # expect: AG124
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optim, lr_scheduler=self.lr_sched,
            config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
                    "gradient_clipping": 1.0})

    def fit(self):
        for _ in range(self.epochs):
            for batch in self.data:
                loss = self.engine(**batch).loss
                self.engine.backward(loss)
                self.engine.step()
