"""Offline actor-critic for continuous actions, as a LightningModule.

Shared trunk with a Gaussian policy head (state-independent log-std) and a
value head; the policy is trained with an advantage-weighted log-likelihood,
the value head with an MSE, plus a small entropy bonus.
"""
import hashlib
import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset

HPARAMS = dict(
    obs_dim=10, act_dim=6, hidden=48,
    lr=1e-2, vf_coef=0.5, ent_coef=0.01, init_log_std=0.0,
    batch_size=8, accumulate=4, max_epochs=4, n_transitions=256, seed=3,
)


class BanditLog(Dataset):
    """Logged transitions (obs, action, reward) from a random behaviour policy."""

    def __init__(self, n, obs_dim, act_dim, seed):
        g = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(n, obs_dim, generator=g)
        w = torch.randn(obs_dim, act_dim, generator=g) / obs_dim ** 0.5
        self.actions = torch.randn(n, act_dim, generator=g)
        self.rewards = -((self.actions - self.obs @ w) ** 2).sum(1)
        self.rewards += 0.2 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.actions)

    def __getitem__(self, i):
        return self.obs[i], self.actions[i], self.rewards[i]


class ActorCritic(nn.Module):
    def __init__(self, obs_dim, hidden, act_dim):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.pi = nn.Linear(hidden, act_dim)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


class GaussianAC(pl.LightningModule):
    def __init__(self, **hp):
        super().__init__()
        self.save_hyperparameters()
        self.net = ActorCritic(hp["obs_dim"], hp["hidden"], hp["act_dim"])
        self.log_std = torch.full((hp["act_dim"],), hp["init_log_std"], requires_grad=True)

    def losses(self, batch):
        obs, actions, rewards = batch
        mu, value = self.net(obs)
        dist = torch.distributions.Normal(mu, self.log_std.exp())
        logp = dist.log_prob(actions).sum(-1)
        entropy = dist.entropy().sum(-1)
        adv = (rewards - value).detach()
        pg_loss = -(adv * logp).mean()
        v_loss = F.mse_loss(value, rewards)
        ent_loss = -entropy.mean()
        return pg_loss, v_loss, ent_loss

    def training_step(self, batch, batch_idx):
        pg_loss, v_loss, ent_loss = self.losses(batch)
        hp = self.hparams
        return pg_loss + hp.vf_coef * v_loss + hp.ent_coef * ent_loss

    def configure_optimizers(self):
        return torch.optim.Adam([
            {"params": self.net.parameters()},
            {"params": [self.log_std]},
        ], lr=self.hparams.lr)


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    pl.seed_everything(HPARAMS["seed"], workers=True)
    model = GaussianAC(**HPARAMS)
    data = BanditLog(HPARAMS["n_transitions"], HPARAMS["obs_dim"], HPARAMS["act_dim"], seed=11)
    loader = DataLoader(data, batch_size=HPARAMS["batch_size"], shuffle=True, drop_last=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=HPARAMS["max_epochs"],
        accumulate_grad_batches=HPARAMS["accumulate"], deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        print(f"FINAL_SHA256 {params_sha256(model)}")
