# corpus: style=ddp class=OK
# A GAN on DDP: the generator's window runs its fake batch through the discriminator's inner
# module while the discriminator is frozen (requires_grad_(False) before, True after): the
# discriminator holds no gradient there, so DDP's missing reduction reduces nothing it needs.
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

K = 4


def sync(model, last):
    return contextlib.nullcontext() if last else model.no_sync()


def train(real_batches, noise):
    G = DDP(torch.nn.Linear(8, 16))
    D = DDP(torch.nn.Linear(16, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4)
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4)
    for real in real_batches:
        for k in range(K):
            with sync(D, k == K - 1):
                with torch.no_grad():
                    fake = G(noise())
                logits = D(torch.cat([real, fake]))
                labels = torch.cat([torch.ones(len(real), 1), torch.zeros(len(fake), 1)])
                (F.binary_cross_entropy_with_logits(logits, labels) / K).backward()
        opt_d.step()
        opt_d.zero_grad()
        D.module.requires_grad_(False)
        for k in range(K):
            with sync(G, k == K - 1):
                g_loss = F.softplus(-D.module(G(noise()))).mean() / K
                g_loss.backward()
        opt_g.step()
        opt_g.zero_grad()
        D.module.requires_grad_(True)
