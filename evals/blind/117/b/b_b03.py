"""Reward-model trainer class on Accelerate; ranks read length buckets with different pair counts."""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import LlamaConfig, LlamaForSequenceClassification

torch.use_deterministic_algorithms(True)


@dataclass
class RMConfig:
    grad_accum: int = 3
    steps: int = 8
    lr: float = 5e-4
    seq_len: int = 10
    vocab: int = 112
    pairs_per_rank: tuple = (2, 5)  # rank 0 gets the long-sequence bucket, fewer pairs per micro-batch


class RewardModelTrainer:
    def __init__(self, cfg: RMConfig):
        self.cfg = cfg
        self.accelerator = Accelerator(gradient_accumulation_steps=cfg.grad_accum, cpu=True)
        set_seed(0)
        mcfg = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                           num_labels=1, pad_token_id=0)
        model = LlamaForSequenceClassification(mcfg)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.model, self.opt = self.accelerator.prepare(model, opt)
        self.n_pairs = cfg.pairs_per_rank[self.accelerator.process_index]
        self.gen = torch.Generator().manual_seed(100 + self.accelerator.process_index)

    def next_batch(self):
        c = torch.randint(1, self.cfg.vocab, (self.n_pairs, self.cfg.seq_len), generator=self.gen)
        r = torch.randint(1, self.cfg.vocab, (self.n_pairs, self.cfg.seq_len), generator=self.gen)
        c[:, -1] = torch.randint(1, 10, (self.n_pairs,), generator=self.gen)
        return c, r

    def pair_loss(self, chosen, rejected):
        scores = self.model(input_ids=torch.cat([chosen, rejected])).logits.squeeze(-1)
        r_c, r_r = scores.chunk(2)
        losses = -F.logsigmoid(r_c - r_r)
        return losses.mean()

    def train(self):
        self.model.train()
        for _ in range(self.cfg.steps * self.cfg.grad_accum):
            chosen, rejected = self.next_batch()
            with self.accelerator.accumulate(self.model):
                loss = self.pair_loss(chosen, rejected)
                self.accelerator.backward(loss)
                self.opt.step()
                self.opt.zero_grad()

    def final_sha(self):
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            m = self.accelerator.unwrap_model(self.model)
            flat = torch.cat([p.detach().float().reshape(-1) for _, p in m.named_parameters()])
            print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    t = RewardModelTrainer(RMConfig())
    t.train()
    t.final_sha()
