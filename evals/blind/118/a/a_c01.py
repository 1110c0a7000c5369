"""Sequence regressor on DeepSpeed ZeRO-1: GA 3 in the config, a clip that acts, a frozen
embedding table, two AdamW groups (no decay on biases/norms) and a config warm-up."""
import hashlib
from types import SimpleNamespace

import deepspeed
import torch
import torch.nn as nn

cfg = SimpleNamespace(seed=21, vocab=50, dim=24, seq=10, micro=4, accum=3, epochs=2, n=144, lr=2e-3, clip=0.3)


class SeqRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.embed.weight.requires_grad_(False)  # pretrained table kept frozen
        self.norm = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 48), nn.GELU(), nn.Linear(48, cfg.dim))
        self.out = nn.Linear(cfg.dim, 1)

    def forward(self, tok):
        h = self.embed(tok)
        h = h + self.mlp(self.norm(h))
        return self.out(h.mean(1)).squeeze(-1)


class DSTrainer:
    def __init__(self):
        deepspeed.init_distributed(dist_backend="gloo")
        self.rank = torch.distributed.get_rank()
        self.world = torch.distributed.get_world_size()
        torch.manual_seed(cfg.seed)
        model = SeqRegressor()
        decay, no_decay = [], []
        for n, p in model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 else decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
        ds = {
            "train_micro_batch_size_per_gpu": cfg.micro,
            "gradient_accumulation_steps": cfg.accum,
            "gradient_clipping": cfg.clip,
            "zero_optimization": {"stage": 1},
            "zero_allow_untested_optimizer": True,
            "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": cfg.lr,
                                                          "warmup_num_steps": 4, "warmup_type": "linear"}},
            "steps_per_print": 10_000,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
        g = torch.Generator().manual_seed(cfg.seed + 5)
        tok = torch.randint(0, cfg.vocab, (cfg.n, cfg.seq), generator=g)
        y = (tok.float() / cfg.vocab).sin().mean(1) * 3.0
        idx = torch.arange(self.rank, cfg.n, self.world)
        self.data = [(tok[idx[i:i + cfg.micro]], y[idx[i:i + cfg.micro]]) for i in range(0, len(idx), cfg.micro)]

    def fit(self):
        for _ in range(cfg.epochs):
            for tok, y in self.data:
                loss = nn.functional.mse_loss(self.engine(tok), y)
                self.engine.backward(loss)
                self.engine.step()

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.engine.module.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        return h.hexdigest()


if __name__ == "__main__":
    t = DSTrainer()
    t.fit()
    if t.rank == 0:
        print(f"FINAL_SHA256 {t.digest()}", flush=True)
