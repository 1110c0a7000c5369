"""PPO-style actor/critic update with two DeepSpeed engines (DeepSpeed-Chat layout).

Actor: ZeRO-0, bf16.  Critic: ZeRO-0, fp32.  Both accumulate over K micro-batches.
"""
import argparse
import hashlib
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def get_train_ds_config(micro_bs, grad_accum, world_size, stage, bf16, clip):
    return {
        "train_micro_batch_size_per_gpu": micro_bs,
        "train_batch_size": micro_bs * world_size * grad_accum,
        "gradient_clipping": clip,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }


def get_eval_ds_config(micro_bs, world_size, stage):
    # reference / reward models: forward only
    return {
        "train_micro_batch_size_per_gpu": micro_bs,
        "train_batch_size": micro_bs * world_size,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10_000,
    }


class Policy(nn.Module):
    def __init__(self, obs_dim=12, n_act=5, hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.logits = nn.Linear(hidden, n_act)

    def forward(self, obs):
        return self.logits(self.body(obs))


class Critic(nn.Module):
    def __init__(self, obs_dim=12, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, obs):
        return self.net(obs).squeeze(-1)


def make_rollouts(n, rank, it, obs_dim=12, n_act=5):
    g = torch.Generator().manual_seed(1000 * it + rank)
    obs = torch.randn(n, obs_dim, generator=g)
    act = torch.randint(0, n_act, (n,), generator=g)
    old_logp = -torch.rand(n, generator=g) - 1.0
    adv = torch.randn(n, generator=g)
    ret = torch.randn(n, generator=g) * 2.0 + 0.5
    return obs, act, old_logp, adv, ret


def actor_loss_fn(logits, act, old_logp, adv, clip_eps=0.2):
    logp = torch.log_softmax(logits.float(), -1).gather(-1, act[:, None]).squeeze(-1)
    ratio = torch.exp(logp - old_logp)
    ratio = torch.clamp(ratio, 0.0, 10.0)
    pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    return pg.mean()


def critic_loss_fn(values, ret):
    return 0.5 * F.mse_loss(values.float(), ret)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--per_device_training_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=2)
    p.add_argument("--ppo_iterations", type=int, default=8)
    p.add_argument("--actor_lr", type=float, default=3e-3)
    p.add_argument("--critic_lr", type=float, default=5e-3)
    args = p.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    actor = Policy()
    critic = Critic()
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=args.actor_lr, weight_decay=0.0)
    critic_opt = torch.optim.SGD(critic.parameters(), lr=args.critic_lr, momentum=0.9)

    actor_cfg = get_train_ds_config(args.per_device_training_batch_size, args.gradient_accumulation_steps,
                                    world, stage=0, bf16=True, clip=1.0)
    critic_cfg = get_eval_ds_config(args.per_device_training_batch_size, world, stage=0)

    actor_engine, *_ = deepspeed.initialize(model=actor, optimizer=actor_opt, config=actor_cfg)
    critic_engine, *_ = deepspeed.initialize(model=critic, optimizer=critic_opt, config=critic_cfg)

    mb = args.per_device_training_batch_size
    K = args.gradient_accumulation_steps
    for it in range(args.ppo_iterations):
        obs, act, old_logp, adv, ret = make_rollouts(mb * K, rank, it)
        for k in range(K):
            sl = slice(k * mb, (k + 1) * mb)
            o = obs[sl]
            logits = actor_engine(o.to(torch.bfloat16))
            a_loss = actor_loss_fn(logits, act[sl], old_logp[sl], adv[sl])
            actor_engine.backward(a_loss)
            actor_engine.step()

            values = critic_engine(o)
            c_loss = critic_loss_fn(values, ret[sl])
            critic_engine.backward(c_loss)
            critic_engine.step()
        if rank == 0 and it % 4 == 0:
            print(f"iter {it} actor_loss {a_loss.item():.4f} critic_loss {c_loss.item():.4f}")

    h = hashlib.sha256()
    for eng in (actor_engine, critic_engine):
        for _, prm in eng.module.named_parameters():
            h.update(prm.detach().float().contiguous().cpu().numpy().tobytes())
    if rank == 0:
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
