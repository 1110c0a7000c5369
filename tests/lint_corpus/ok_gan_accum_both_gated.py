# corpus: style=gan class=OK
n_critic_accum = 4
for i, real in enumerate(loader):
    fake = gen(noise(real.size(0)))
    d_loss = (disc(fake.detach()).mean() - disc(real).mean()) / n_critic_accum
    d_loss.backward()
    if (i + 1) % n_critic_accum == 0:
        opt_d.step()
        opt_d.zero_grad()
        g_loss = -disc(gen(noise(real.size(0)))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
