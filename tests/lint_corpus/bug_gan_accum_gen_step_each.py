# corpus: style=gan class=F1
import torch

accum = 4
opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
for i, real in enumerate(loader):
    fake = gen(torch.randn(real.size(0), 100))
    d_loss = (bce(disc(real), ones) + bce(disc(fake.detach()), zeros)) / accum
    d_loss.backward()
    if (i + 1) % accum == 0:
        opt_d.step()
        opt_d.zero_grad()
    g_loss = bce(disc(fake), ones) / accum
    g_loss.backward()
    opt_g.step()  # expect: AG101
    opt_g.zero_grad()
