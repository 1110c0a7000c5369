# corpus: style=lightning class=OK
# a fraction of the loader per epoch: the number of batches is not in the source
import lightning.pytorch as pl

trainer = pl.Trainer(max_epochs=3, limit_train_batches=0.25, accumulate_grad_batches=4)
trainer.fit(model, loader)
