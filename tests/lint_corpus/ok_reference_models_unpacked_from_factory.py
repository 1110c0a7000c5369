# corpus: style=accelerate class=OK
# the training run prepares the models; the single-process reference builds its own pair
# from the file's factory (unpacked from one call) and divides by its batch's token count:
# no rank average touches that gradient
import torch
from accelerate import Accelerator


def make_models(cfg):
    return torch.nn.Linear(cfg["d"], cfg["v"]), torch.nn.Linear(cfg["d"], 1)


def token_loss(policy, critic, b):
    return (-policy(b["x"]).log_softmax(-1).amax(-1) * b["mask"]).sum() + critic(b["x"]).pow(2).sum()


def train(cfg, loader, k=2):
    acc = Accelerator(gradient_accumulation_steps=k)
    policy, critic = make_models(cfg)
    opt = torch.optim.AdamW([*policy.parameters(), *critic.parameters()], lr=1e-3)
    policy, critic, opt, loader = acc.prepare(policy, critic, opt, loader)
    n_window = acc.gather(torch.tensor([sum(b["mask"].sum() for b in loader)])).sum()
    for batch in loader:
        with acc.accumulate(policy, critic):
            acc.backward(token_loss(policy, critic, batch) / n_window * k * acc.num_processes)
            opt.step()
            opt.zero_grad()


def reference(cfg, rollout, n_windows, big):
    policy, critic = make_models(cfg)
    opt = torch.optim.AdamW([*policy.parameters(), *critic.parameters()], lr=1e-3)
    for w in range(n_windows):
        rows = rollout[w * big:(w + 1) * big]
        b = {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
        loss = token_loss(policy, critic, b) / b["mask"].sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
