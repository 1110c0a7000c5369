# corpus: style=lightning class=OK
# 32 rows in batches of 8: 4 batches per epoch, one full window of 4
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

features = torch.randn(32, 8)
targets = torch.randint(0, 3, (32,))
trainer = pl.Trainer(max_epochs=30, accumulate_grad_batches=4, logger=False)
trainer.fit(Classifier(), DataLoader(TensorDataset(features, targets), batch_size=8))
