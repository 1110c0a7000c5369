"""GAN-style loops with two optimizers, for ``accumguard watch`` (each optimizer has its own
window): the discriminator steps every batch with its own ``zero_grad``, the generator
accumulates K = 4 batches and steps at its boundary.

``python gan_loops.py plain|lightning [gen_zero_grad]``: plain PyTorch, or Lightning's
manual optimisation (``automatic_optimization = False``, ``manual_backward``);
``gen_zero_grad``: the generator's own ``zero_grad`` inside its window (F3).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

K = 4
BATCHES = 4 * K


def nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return (nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)),
            nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)))


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 4, generator=g))
            for _ in range(BATCHES)]


def plain(bug: str) -> None:
    gen, disc = nets()
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    for i, (x, z) in enumerate(data()):
        opt_d.zero_grad()
        loss_d = bce(disc(x), torch.ones(4, 1)) + bce(disc(gen(z).detach()), torch.zeros(4, 1))
        loss_d.backward()
        opt_d.step()
        if bug == "gen_zero_grad":
            opt_g.zero_grad()
        (bce(disc(gen(z)), torch.ones(4, 1)) / K).backward()
        if (i + 1) % K == 0:
            opt_g.step()
            opt_g.zero_grad()


def lightning(bug: str) -> None:
    import pytorch_lightning as pl

    class Gan(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.gen, self.disc = nets()
            self.bce = nn.BCEWithLogitsLoss()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            x, z = batch
            x, z = x[0], z[0]
            opt_g, opt_d = self.optimizers()
            opt_d.zero_grad()
            loss_d = (self.bce(self.disc(x), torch.ones(4, 1))
                      + self.bce(self.disc(self.gen(z).detach()), torch.zeros(4, 1)))
            self.manual_backward(loss_d)
            opt_d.step()
            if bug == "gen_zero_grad":
                opt_g.zero_grad()
            self.manual_backward(self.bce(self.disc(self.gen(z)), torch.ones(4, 1)) / K)
            if (batch_idx + 1) % K == 0:
                opt_g.step()
                opt_g.zero_grad()

        def configure_optimizers(self) -> list[torch.optim.Optimizer]:
            return [torch.optim.Adam(self.gen.parameters(), lr=1e-3),
                    torch.optim.Adam(self.disc.parameters(), lr=1e-3)]

    loader = torch.utils.data.DataLoader(data(), batch_size=1)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Gan(), loader)


if __name__ == "__main__":
    {"plain": plain, "lightning": lightning}[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2
                                                           else "")
