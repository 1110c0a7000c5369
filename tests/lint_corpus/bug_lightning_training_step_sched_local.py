# corpus: style=lightning class=F4
# automatic optimisation with accumulate_grad_batches=8; the warm-up scheduler is fetched into a
# local name and stepped in training_step, i.e. on every batch: 8 scheduler steps per update
import lightning.pytorch as pl
import torch


class LitLM(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        warmup = self.lr_schedulers()
        warmup.step()  # expect: AG119
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=2e-4)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=500)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


pl.Trainer(max_steps=5000, accumulate_grad_batches=8).fit(LitLM(), dm)
