# corpus: style=lightning class=F8
# adaptive gradient clipping registered as post-accumulate hooks in on_fit_start: it clips
# each rank's running sum after every micro-batch of Lightning's window
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

    def on_fit_start(self):
        for p in self.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda t: adaptive_clip_(t, 0.02))  # expect: AG138


pl.Trainer(accumulate_grad_batches=4, devices=2, strategy="ddp").fit(Classifier(), loader)
