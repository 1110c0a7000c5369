"""Actor-critic on a contextual bandit with Lightning Fabric (DDP, 2 ranks): separate actor
and critic modules with their own optimizers (Adam, SGD), K = 2 under no_backward_sync, and
a mid-run checkpoint reloaded into freshly built objects."""
import hashlib
import os

import torch
import torch.nn as nn
from lightning_fabric import Fabric

K, MICRO, SIZE = 2, 4, 8
STEPS_A, STEPS_B = 4, 4  # rollouts before / after the resume
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "c_c03.ckpt")


def build(fabric):
    torch.manual_seed(21)
    actor = nn.Sequential(nn.Linear(5, 24), nn.Tanh(), nn.Linear(24, 3))
    critic = nn.Sequential(nn.Linear(5, 24), nn.Tanh(), nn.Linear(24, 1))
    a_opt = torch.optim.Adam(actor.parameters(), lr=5e-3)
    c_opt = torch.optim.SGD(critic.parameters(), lr=5e-2, momentum=0.9)
    actor_w, a_opt = fabric.setup(actor, a_opt)
    critic_w, c_opt = fabric.setup(critic, c_opt)
    return actor, actor_w, a_opt, critic_w, c_opt


def rollout_batch(it, rank, j):
    g = torch.Generator().manual_seed(1000 * it + 100 * rank + j)
    s = torch.randn(SIZE, 5, generator=g)
    return s, g


def train(fabric, objs, it0, n_iters):
    actor, actor_w, a_opt, critic_w, c_opt = objs
    W = torch.tensor([[1.0, -1.0, 0.5], [0.3, 0.8, -0.2], [-0.5, 0.1, 1.0], [0.0, 0.4, 0.4], [1.0, 1.0, -1.0]])
    for it in range(it0, it0 + n_iters):
        for j in range(MICRO):
            s, g = rollout_batch(it, fabric.global_rank, j)
            sync = (j + 1) % K == 0
            with fabric.no_backward_sync(actor_w, enabled=not sync), \
                    fabric.no_backward_sync(critic_w, enabled=not sync):
                logp = torch.log_softmax(actor_w(s), -1)
                with torch.no_grad():
                    a = torch.multinomial(logp.exp(), 1, generator=g).squeeze(-1)
                    r = (s @ W).gather(-1, a[:, None]).squeeze(-1)
                v = critic_w(s).squeeze(-1)
                adv = (r - v).detach()
                pg = -(logp.gather(-1, a[:, None]).squeeze(-1) * adv).mean()
                vf = 0.5 * ((v - r) ** 2).mean()
                fabric.backward((pg + vf) / K)
            if sync:
                a_opt.step()
                c_opt.step()
                a_opt.zero_grad()
                c_opt.zero_grad()


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    objs = build(fabric)
    train(fabric, objs, 0, STEPS_A)
    _, actor_w, a_opt, critic_w, c_opt = objs
    fabric.save(CKPT, {"actor": actor_w, "critic": critic_w, "a_opt": a_opt, "c_opt": c_opt, "it": STEPS_A})
    fabric.barrier()

    objs = build(fabric)  # fresh objects, weights and optimizer state from disk
    _, actor_w, a_opt, critic_w, c_opt = objs
    state = {"actor": actor_w, "critic": critic_w, "a_opt": a_opt, "c_opt": c_opt, "it": 0}
    fabric.load(CKPT, state)
    train(fabric, objs, state["it"], STEPS_B)

    if fabric.global_rank == 0:
        model = nn.ModuleDict({"actor": objs[1].module, "critic": objs[3].module})
        blob = b"".join(p.detach().float().cpu().contiguous().numpy().tobytes() for _, p in model.named_parameters())
        print("FINAL_SHA256", hashlib.sha256(blob).hexdigest())


if __name__ == "__main__":
    main()
