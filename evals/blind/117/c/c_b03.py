"""Offline RLHF-style policy-gradient fine-tuning of a tiny LM with Lightning Fabric.

REINFORCE on logged responses with a KL penalty to a frozen reference, whose coefficient
follows the adaptive controller of Ziegler et al. (as in TRL's AdaptiveKLController).
Fabric DDP on 2 CPU ranks, K micro-batches per optimizer step via no_backward_sync.
"""
import copy
import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning_fabric import Fabric


@dataclass
class Config:
    vocab: int = 16
    d_model: int = 32
    prompt_len: int = 4
    resp_len: int = 8
    micro_batch: int = 8
    grad_accum: int = 4
    world: int = 2
    steps: int = 24
    lr: float = 1e-2
    init_kl_coef: float = 0.5
    target_kl: float = 0.5
    kl_horizon: int = 1000

    @property
    def batch_size(self):        # sequences per optimizer step, all ranks
        return self.micro_batch * self.grad_accum * self.world


class AdaptiveKLController:
    def __init__(self, init_kl_coef, target, horizon):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current, n_steps):
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.rnn = nn.GRU(cfg.d_model, cfg.d_model, batch_first=True)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.head(h)


def response_logprobs(model, ids, prompt_len):
    logits = model(ids[:, :-1])[:, prompt_len - 1:]
    return torch.gather(F.log_softmax(logits, -1), 2, ids[:, prompt_len:, None]).squeeze(-1)


def make_rollouts(cfg, rank):
    g = torch.Generator().manual_seed(2024)
    n = cfg.world * cfg.steps * cfg.grad_accum * cfg.micro_batch
    ids = torch.randint(0, cfg.vocab, (n, cfg.prompt_len + cfg.resp_len), generator=g)
    resp = ids[:, cfg.prompt_len:]
    reward = (resp == 3).float().mean(-1) - 0.3 * (resp == 7).float().mean(-1)
    adv = (reward - reward.mean()) / (reward.std() + 1e-6)
    return ids[rank::cfg.world], adv[rank::cfg.world]


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Config()
    fabric = Fabric(accelerator="cpu", devices=cfg.world, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    torch.use_deterministic_algorithms(True)

    policy = TinyLM(cfg)
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    model, opt = fabric.setup(policy, opt)
    kl_ctl = AdaptiveKLController(cfg.init_kl_coef, cfg.target_kl, cfg.kl_horizon)

    ids_all, adv_all = make_rollouts(cfg, fabric.global_rank)
    K, B = cfg.grad_accum, cfg.micro_batch
    it = 0
    for step in range(cfg.steps):
        for micro in range(K):
            ids = ids_all[it * B:(it + 1) * B]
            adv = adv_all[it * B:(it + 1) * B]
            it += 1
            with fabric.no_backward_sync(model, enabled=micro < K - 1):
                logp = response_logprobs(model, ids, cfg.prompt_len)
                with torch.no_grad():
                    ref_logp = response_logprobs(ref, ids, cfg.prompt_len)
                kl = (logp - ref_logp).sum(-1).mean()
                pg = -(adv * logp.sum(-1)).mean()
                loss = pg + kl_ctl.value * kl
                fabric.backward(loss / K)
            kl_now = fabric.all_reduce(kl.detach(), reduce_op="mean").item()
            kl_ctl.update(kl_now, n_steps=cfg.batch_size)
        opt.step()
        opt.zero_grad()

    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(policy)}", flush=True)
        torch.save(policy.state_dict(),
                   os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                                os.path.basename(__file__).replace(".py", ".pt")))
    fabric.barrier()


if __name__ == "__main__":
    main()
