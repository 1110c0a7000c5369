"""Epochs shorter than K, and an epoch's partial tail, under ``accumguard watch``.

``lightning_short``: Lightning ``accumulate_grad_batches=4`` on epochs of 3 batches
(Lightning steps at each epoch's end: every window is 3 batches). ``lightning_ok``: the
same with K = 3 (every window a whole epoch of K). ``plain_drop``: a plain loop with a
per-epoch counter that zeroes the gradients at each epoch's start, dropping the epoch's
partial tail (a choice that loses data, not a wrong update). ``plain_leak``: the same
without the zero_grad: the tail leaks into the next epoch's first window (F7).
``plain_tail_ok``: steps on the tail, normalised by its own size.
"""

import sys

import torch

mode = sys.argv[1]
torch.manual_seed(0)
g = torch.Generator().manual_seed(7)
xs, ys = torch.randn(12, 8, generator=g), torch.randint(0, 2, (12,), generator=g)
data = torch.utils.data.TensorDataset(xs, ys)

if mode.startswith("lightning"):
    import pytorch_lightning as pl

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                           torch.nn.Linear(16, 2))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    k = 4 if mode == "lightning_short" else 3
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # 3 batches per epoch
    trainer = pl.Trainer(max_epochs=3, accumulate_grad_batches=k, accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(), loader)
    print("done", trainer.global_step)
else:
    K = 4
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=2)  # 6 batches: a tail of 2
    for _ in range(3):
        if mode == "plain_drop":
            opt.zero_grad()
        for i, (x, y) in enumerate(loader):
            tail = len(loader) - len(loader) % K
            n = K if i < tail or mode != "plain_tail_ok" else len(loader) % K
            (torch.nn.functional.cross_entropy(model(x), y) / n).backward()
            last = mode == "plain_tail_ok" and i + 1 == len(loader)
            if (i + 1) % K == 0 or last:
                opt.step()
                opt.zero_grad()
    print("done")
