# corpus: style=lightning class=F5
# a padded tagger returns its token mean from training_step; Lightning divides it by
# accumulate_grad_batches, read from a config made with dict(...) under another name
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

IGNORE = -100
CONFIG = dict(lr=1e-3, accum=4, epochs=2)


class Tagger(pl.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        logits = self.net(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
        self.log("train_loss", loss)
        return loss  # expect: AG104

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main(net, loader):
    cfg = CONFIG
    trainer = pl.Trainer(accelerator="cpu", max_epochs=cfg["epochs"],
                         accumulate_grad_batches=cfg["accum"])
    trainer.fit(Tagger(net), loader)
