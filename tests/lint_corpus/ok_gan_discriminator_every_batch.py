# corpus: style=plain class=OK
# GAN: the discriminator steps on every batch; the generator accumulates ACCUM batches
# before its step (its own, larger batch); each optimizer zeroes only its own gradients
import torch

ACCUM = 2
gen, disc = make_generator(), make_discriminator()
opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
bce = torch.nn.BCEWithLogitsLoss()

for i, real in enumerate(loader):
    z = torch.randn(real.size(0), 128)
    fake = gen(z)
    d_loss = bce(disc(real), torch.ones(real.size(0), 1)) + bce(disc(fake.detach()), torch.zeros(real.size(0), 1))
    opt_d.zero_grad(set_to_none=True)
    d_loss.backward()
    opt_d.step()

    g_loss = bce(disc(fake), torch.ones(real.size(0), 1)) / ACCUM
    g_loss.backward()
    if (i + 1) % ACCUM == 0:
        opt_g.step()
        opt_g.zero_grad(set_to_none=True)
