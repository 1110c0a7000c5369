# corpus: style=gan class=OK
# two optimizers, no accumulation: stepping every batch is right
import torch

opt_d = torch.optim.Adam(netD.parameters(), lr=2e-4)
opt_g = torch.optim.Adam(netG.parameters(), lr=2e-4)
for epoch in range(25):
    for i, (real, _) in enumerate(dataloader):
        netD.zero_grad()
        err_d = criterion(netD(real), ones) + criterion(netD(netG(noise).detach()), zeros)
        err_d.backward()
        opt_d.step()
        netG.zero_grad()
        err_g = criterion(netD(netG(noise)), ones)
        err_g.backward()
        opt_g.step()
        if i % 100 == 0:
            print(epoch, i, err_d.item(), err_g.item())
