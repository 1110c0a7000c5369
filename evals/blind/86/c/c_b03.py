# CleanRL-style PPO (ppo.py) on a synthetic vectorised task, 2 DDP ranks via torchrun.
# Minibatch gradients are accumulated: one optimizer step every `grad_accum` minibatches,
# counted across update epochs; early stopping on approx KL as in CleanRL (`target_kl`).
import argparse, hashlib, os, random
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions.categorical import Categorical
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=2.5e-3)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--num-steps", type=int, default=12)
    p.add_argument("--num-iterations", type=int, default=5)
    p.add_argument("--anneal-lr", type=bool, default=True)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=3)
    p.add_argument("--update-epochs", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--target-kl", type=float, default=2e-5)
    a = p.parse_args()
    a.batch_size = a.num_envs * a.num_steps
    a.minibatch_size = a.batch_size // a.num_minibatches
    return a


class ToyVecEnv:
    """Contextual task: 6-d observation, 4 actions, reward = <obs, W[a]>, episodes of 4 steps."""

    def __init__(self, num_envs, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.W = torch.randn(4, 6, generator=torch.Generator().manual_seed(99))
        self.n = num_envs
        self.t = torch.zeros(num_envs, dtype=torch.long)
        self.obs = torch.randn(num_envs, 6, generator=self.g)

    def reset(self):
        return self.obs.clone()

    def step(self, action):
        reward = (self.obs * self.W[action]).sum(-1)
        self.t += 1
        done = (self.t % 4 == 0).float()
        self.obs = 0.7 * self.obs + 0.5 * torch.randn(self.n, 6, generator=self.g)
        return self.obs.clone(), reward, done


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(6, 32)), nn.Tanh(), layer_init(nn.Linear(32, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(6, 32)), nn.Tanh(), layer_init(nn.Linear(32, 4), std=0.01))

    def get_value(self, x):
        return self.critic(x)

    def forward(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    random.seed(args.seed); np.random.seed(args.seed); torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    agent = Agent()
    ddp_agent = DDP(agent)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    envs = ToyVecEnv(args.num_envs, seed=args.seed * 1000 + rank)
    torch.manual_seed(args.seed * 1000 + rank)  # per-rank action sampling

    obs = torch.zeros((args.num_steps, args.num_envs, 6))
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs = torch.zeros((args.num_steps, args.num_envs))
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))
    values = torch.zeros((args.num_steps, args.num_envs))

    next_obs = envs.reset()
    next_done = torch.zeros(args.num_envs)
    for iteration in range(1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(args.num_steps):
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            next_obs, reward, next_done = envs.step(action)
            rewards[step] = reward

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1, 6))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)

        b_inds = np.arange(args.batch_size)
        micro = 0
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start:start + args.minibatch_size]
                micro += 1
                sync = micro % args.grad_accum == 0
                with (ddp_agent.no_sync() if not sync else torch.enable_grad()):
                    _, newlogprob, entropy, newvalue = ddp_agent(b_obs[mb_inds], b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    with torch.no_grad():
                        approx_kl = ((ratio - 1) - logratio).mean()
                    mb_advantages = b_advantages[mb_inds]
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                    v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
                    loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                    (loss / args.grad_accum).backward()
                if sync:
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()

            if args.target_kl is not None:
                dist.all_reduce(approx_kl, op=dist.ReduceOp.AVG)
                if approx_kl > args.target_kl:
                    break

    if rank == 0:
        h = hashlib.sha256()
        for _, p in agent.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
        if os.environ.get("PARAM_DUMP"):
            torch.save({n: p.detach().clone() for n, p in agent.named_parameters()}, os.environ["PARAM_DUMP"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
