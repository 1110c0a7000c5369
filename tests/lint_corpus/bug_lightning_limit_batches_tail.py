# corpus: style=lightning class=F7
# 10 batches per epoch in windows of 4: the third window of every epoch holds 2 batches,
# stepped at the epoch's end with each loss divided by 4 (a warning: the loader may be shorter)
import pytorch_lightning as pl


def main(module, dm):
    trainer = pl.Trainer(  # expect: AG131
        max_epochs=50,
        limit_train_batches=10,
        accumulate_grad_batches=4,
        precision="bf16-mixed",
    )
    trainer.fit(module, datamodule=dm)
