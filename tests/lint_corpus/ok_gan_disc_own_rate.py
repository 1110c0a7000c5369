# corpus: style=gan class=OK
# the discriminator steps (and clips) every batch with its own zero_grad (its own window of
# one batch); the generator accumulates `accum` batches and steps at its boundary
import torch

accum = 4
opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
for i, real in enumerate(loader):
    z = torch.randn(real.size(0), 100)
    opt_d.zero_grad()
    d_loss = bce(disc(real), ones) + bce(disc(gen(z).detach()), zeros)
    d_loss.backward()
    torch.nn.utils.clip_grad_norm_(disc.parameters(), 1.0)
    opt_d.step()
    g_loss = bce(disc(gen(z)), ones) / accum
    g_loss.backward()
    if (i + 1) % accum == 0:
        torch.nn.utils.clip_grad_norm_(gen.parameters(), 1.0)
        opt_g.step()
        opt_g.zero_grad()
