# corpus: style=gan class=OK
import torch

opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
for real in loader:
    z = torch.randn(real.size(0), 100)
    fake = gen(z)
    opt_d.zero_grad()
    d_loss = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    g_loss = bce(disc(fake), ones)
    g_loss.backward()
    opt_g.step()
