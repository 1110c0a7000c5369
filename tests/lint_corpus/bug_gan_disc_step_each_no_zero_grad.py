# corpus: style=gan class=F1
# the discriminator steps on every batch but never clears its gradients there: it does not
# have a window of its own, it steps on the running sum of an accumulation window
import torch

accum = 4
opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
for i, real in enumerate(loader):
    z = torch.randn(real.size(0), 100)
    d_loss = bce(disc(real), ones) + bce(disc(gen(z).detach()), zeros)
    d_loss.backward()
    opt_d.step()  # expect: AG101
    g_loss = bce(disc(gen(z)), ones) / accum
    g_loss.backward()
    if (i + 1) % accum == 0:
        opt_g.step()
        opt_g.zero_grad()
        opt_d.zero_grad()
