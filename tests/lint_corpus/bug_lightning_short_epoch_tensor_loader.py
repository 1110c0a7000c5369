# corpus: style=lightning class=F7
# a small in-memory dataset: 20 rows in batches of 8 are 3 batches per epoch, fewer than the
# 4 accumulated batches: every window is 3 batches, each loss divided by 4
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

features = torch.randn(20, 8)
targets = torch.randint(0, 3, (20,))
loader = DataLoader(TensorDataset(features, targets), batch_size=8, shuffle=True)
trainer = pl.Trainer(max_epochs=30, accumulate_grad_batches=4, logger=False)  # expect: AG131
trainer.fit(Classifier(), loader)
