# corpus: style=gan class=F3
# the discriminator steps at its own rate (fine); the generator clears its own gradients on
# every batch inside its window of `accum`
import torch

accum = 4
opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
for i, real in enumerate(loader):
    z = torch.randn(real.size(0), 100)
    opt_d.zero_grad()
    d_loss = bce(disc(real), ones) + bce(disc(gen(z).detach()), zeros)
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()  # expect: AG102
    g_loss = bce(disc(gen(z)), ones) / accum
    g_loss.backward()
    if (i + 1) % accum == 0:
        opt_g.step()
