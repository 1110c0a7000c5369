# corpus: style=lightning class=OK
# 12 batches per epoch, windows of 4: every window is full
import pytorch_lightning as pl

trainer = pl.Trainer(max_epochs=10, limit_train_batches=12, accumulate_grad_batches=4)
trainer.fit(model, loader)
