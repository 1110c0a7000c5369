# corpus: style=gan class=OK
# WGAN-GP: the critic steps every batch, the generator every n_critic batches, on a
# gradient computed inside its own guarded block: no accumulation, and i % n_critic == 0
# including i = 0 is intended.
import torch

optimizer_G = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
n_critic = 5
for epoch in range(n_epochs):
    for i, (imgs, _) in enumerate(dataloader):
        optimizer_D.zero_grad()
        z = torch.randn(imgs.shape[0], latent_dim)
        fake_imgs = generator(z)
        d_loss = -torch.mean(discriminator(imgs)) + torch.mean(discriminator(fake_imgs.detach()))
        d_loss.backward()
        optimizer_D.step()
        if i % n_critic == 0:
            optimizer_G.zero_grad()
            g_loss = -torch.mean(discriminator(generator(z)))
            g_loss.backward()
            optimizer_G.step()
