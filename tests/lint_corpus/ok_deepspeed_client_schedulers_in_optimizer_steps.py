# corpus: style=deepspeed class=OK
import deepspeed
import torch
from torch.utils.data import DataLoader

GA = 4


def train(model, dataset, epochs=5):
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # one decay per epoch: the engine steps the scheduler once per optimizer step
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=len(loader) // GA, gamma=0.5)
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": GA,
              "gradient_clipping": 0.0}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=config)
    for _ in range(epochs):
        for x, y in loader:
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
            engine.step()


def train_windows(model, windows, epochs=5):
    """A loader of whole windows: len(windows) counts optimizer steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(windows))
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, lr_scheduler=sched,
        config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": GA,
                "gradient_clipping": 1.0})
    for _ in range(epochs):
        for window in windows:
            for x, y in window:
                engine.backward(torch.nn.functional.mse_loss(engine(x), y))
                engine.step()
