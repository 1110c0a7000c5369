# corpus: style=lightning class=OK
# a padded tagger returns its token sum over the window's token count (counted by the
# collate function for the accumulate_grad_batches micro-batches), times K since Lightning
# divides by it: every token weighs 1 / the window's count
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

IGNORE = -100
K = 4


class Tagger(pl.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        logits = self.net(batch["input_ids"])
        tok_sum = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                  ignore_index=IGNORE, reduction="sum")
        return {"loss": tok_sum * K / batch["window_tokens"]}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main(net, loader):
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, accumulate_grad_batches=K)
    trainer.fit(Tagger(net), loader)
