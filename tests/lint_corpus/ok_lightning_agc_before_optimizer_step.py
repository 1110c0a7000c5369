# corpus: style=lightning class=OK
# adaptive gradient clipping once per optimizer step, on the window's gradient
import lightning.pytorch as pl


def adaptive_clip_(p, clip=0.02, eps=1e-3):
    g = p.grad
    max_norm = clip * p.detach().norm().clamp_min(eps)
    g_norm = g.detach().norm()
    if g_norm > max_norm:
        g.mul_(max_norm / (g_norm + 1e-6))


class Classifier(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        return self.loss(batch)

    def on_before_optimizer_step(self, optimizer):
        for p in self.parameters():
            if p.requires_grad and p.grad is not None:
                adaptive_clip_(p, 0.02)


pl.Trainer(accumulate_grad_batches=4, devices=2, strategy="ddp").fit(Classifier(), loader)
