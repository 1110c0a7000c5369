# corpus: style=trainer_class class=F5
# a GRPO-style trainer: the loss method returns the masked token mean of this micro-batch's
# completions (their lengths vary), the accumulation loop divides it by K: a mean of means
from dataclasses import dataclass

import torch


@dataclass
class RLConfig:
    grad_accum_steps: int = 4
    lr: float = 1e-6


class PGTrainer:
    def __init__(self, policy, cfg: RLConfig):
        self.policy = policy
        self.cfg = cfg
        self.opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)

    def token_loss(self, batch):
        logits = self.policy(batch["input_ids"]).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), dim=-1)
        chosen = torch.gather(logp, -1, batch["input_ids"][:, 1:, None]).squeeze(-1)
        mask = batch["completion_mask"][:, 1:].float()
        per_token = -chosen * batch["advantages"][:, None]
        return (per_token * mask).sum() / mask.sum()

    def train(self, batches):
        for i, batch in enumerate(batches):
            loss = self.token_loss(batch)
            loss = loss / self.cfg.grad_accum_steps  # expect: AG104
            loss.backward()
            if (i + 1) % self.cfg.grad_accum_steps == 0:
                self.opt.step()
                self.opt.zero_grad()
