# corpus: style=lightning class=LOSS_SCALE
# token tagging on 2 processes: the summed loss is divided by the window's token count
# (precomputed by the dataset over the K batches of every rank) and multiplied back by the
# world size for DDP's average, but Lightning divides the returned loss by K again: G / K
import lightning.pytorch as L
import torch.nn.functional as F


class Tagger(L.LightningModule):
    def training_step(self, batch, batch_idx):
        logits = self.net(batch["input_ids"])
        per_tok = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                  ignore_index=-100, reduction="none")
        summed = per_tok.sum()
        loss = summed / batch["window_tokens"]
        loss = loss * self.trainer.world_size
        self.log("loss", loss)
        return {"loss": loss}  # expect: AG144


def main(data):
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp",
                        accumulate_grad_batches=4, max_steps=100)
    trainer.fit(Tagger(), data)
