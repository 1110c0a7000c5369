# corpus: style=gan class=OK
# DCGAN style: netD.zero_grad() on the module the discriminator's optimizer was built on,
# D stepped every batch; G accumulates GRAD_ACC batches
import torch.optim as optim

GRAD_ACC = 8
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
for i, data in enumerate(dataloader, 0):
    netD.zero_grad()
    real = data[0]
    errD_real = criterion(netD(real).view(-1), real_label)
    errD_real.backward()
    fake = netG(noise(real.size(0)))
    errD_fake = criterion(netD(fake.detach()).view(-1), fake_label)
    errD_fake.backward()
    optimizerD.step()
    errG = criterion(netD(fake).view(-1), real_label) / GRAD_ACC
    errG.backward()
    if (i + 1) % GRAD_ACC == 0:
        optimizerG.step()
        netG.zero_grad()
