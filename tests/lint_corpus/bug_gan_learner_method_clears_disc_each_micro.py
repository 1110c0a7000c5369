# corpus: style=gan class=F3
"""A small GAN learner: the loop runs its `micro` method K times, then `update`."""
import torch
import torch.nn.functional as F

ACCUM = 4


class GanLearner:
    def __init__(self):
        self.gen = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        self.disc = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.g_opt = torch.optim.Adam(self.gen.parameters(), lr=2e-4)
        self.d_opt = torch.optim.Adam(self.disc.parameters(), lr=2e-4)

    def micro(self, real):
        z = torch.randn(real.shape[0], 8)
        fake = self.gen(z)
        g_loss = F.softplus(-self.disc(fake)).mean()
        (g_loss / ACCUM).backward()
        # the generator loss reached the discriminator too: clear it
        self.d_opt.zero_grad()  # expect: AG102
        d_loss = F.softplus(-self.disc(real)).mean() + F.softplus(self.disc(fake.detach())).mean()
        (d_loss / ACCUM).backward()

    def update(self):
        self.g_opt.step()
        self.d_opt.step()
        self.g_opt.zero_grad()
        self.d_opt.zero_grad()


def train(batches):
    learner = GanLearner()
    for step in range(100):
        for k in range(ACCUM):
            learner.micro(batches[(step * ACCUM + k) % len(batches)])
        learner.update()
