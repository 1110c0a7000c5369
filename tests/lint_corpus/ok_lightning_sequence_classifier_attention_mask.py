# corpus: style=lightning class=OK
# a sequence classifier: one label per row, so the cross-entropy is a mean over the
# micro-batch's rows (equal batches), whatever the attention mask; Lightning's /K is exact
import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class Classifier(pl.LightningModule):
    def __init__(self, encoder, n_labels):
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(encoder.config.hidden_size, n_labels)

    def training_step(self, batch, batch_idx):
        hidden = self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        logits = self.head(hidden.last_hidden_state[:, 0])
        loss = F.cross_entropy(logits, batch["label"])
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-5)


trainer = pl.Trainer(accumulate_grad_batches=4, max_epochs=1)
trainer.fit(Classifier(build_encoder(), 3), make_loader(batch_size=16, drop_last=True))
