# CLIP-style contrastive pre-training on two spawned ranks. Learnable temperature lives in the
# criterion (as in several SimCLR/CLIP re-implementations); towers are wrapped in DDP.
import hashlib, math, os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class TrainConfig:
    world_size: int = 2
    port: int = 38903
    seed: int = 7
    vocab: int = 64
    seq_len: int = 12
    img_dim: int = 48
    embed_dim: int = 32
    n_pairs: int = 288
    micro_batch: int = 8
    grad_accum: int = 3
    epochs: int = 3
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: int = 2


class DualEncoder(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(cfg.img_dim, 64), nn.GELU(), nn.Linear(64, cfg.embed_dim))
        self.tok = nn.Embedding(cfg.vocab, 32)
        self.text_proj = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, cfg.embed_dim))

    def forward(self, images, tokens):
        img = F.normalize(self.visual(images), dim=-1)
        txt = F.normalize(self.text_proj(self.tok(tokens).mean(1)), dim=-1)
        return img, txt


class ClipLoss(nn.Module):
    """Symmetric InfoNCE with a learnable inverse temperature."""

    def __init__(self, init_temp: float = 0.07):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / init_temp))

    def forward(self, img, txt):
        scale = self.logit_scale.exp()
        logits = scale * img @ txt.t()
        labels = torch.arange(img.shape[0])
        return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


def make_data(cfg: TrainConfig):
    g = torch.Generator().manual_seed(1000)
    tokens = torch.randint(0, cfg.vocab, (cfg.n_pairs, cfg.seq_len), generator=g)
    mix = torch.randn(cfg.vocab, cfg.img_dim, generator=g)
    images = F.one_hot(tokens, cfg.vocab).float().mean(1) @ mix + 0.3 * torch.randn(cfg.n_pairs, cfg.img_dim, generator=g)
    return images, tokens


class ClipTrainer:
    def __init__(self, cfg: TrainConfig, rank: int):
        self.cfg, self.rank = cfg, rank
        torch.manual_seed(cfg.seed)
        self.raw_model = DualEncoder(cfg)
        self.model = DDP(self.raw_model)
        self.criterion = ClipLoss()
        params = list(self.model.parameters()) + list(self.criterion.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        images, tokens = make_data(cfg)
        self.images, self.tokens = images[rank::cfg.world_size], tokens[rank::cfg.world_size]
        steps_per_epoch = len(self.images) // (cfg.micro_batch * cfg.grad_accum)
        self.total_steps = steps_per_epoch * cfg.epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_lambda)

    def lr_lambda(self, step):
        if step < self.cfg.warmup:
            return (step + 1) / self.cfg.warmup
        progress = (step - self.cfg.warmup) / max(1, self.total_steps - self.cfg.warmup)
        return 0.5 * (1 + math.cos(math.pi * progress))

    def micro_batches(self, epoch):
        g = torch.Generator().manual_seed(self.cfg.seed * 100 + epoch)
        perm = torch.randperm(len(self.images), generator=g)
        mb = self.cfg.micro_batch
        for i in range(0, len(perm) - mb + 1, mb):
            idx = perm[i:i + mb]
            yield self.images[idx], self.tokens[idx]

    def forward_backward(self, images, tokens, sync: bool):
        ctx = self.model.no_sync() if not sync else _nullcontext()
        with ctx:
            img, txt = self.model(images, tokens)
            loss = self.criterion(img, txt) / self.cfg.grad_accum
            loss.backward()
        return loss.detach()

    def optimizer_step(self):
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            self.criterion.logit_scale.clamp_(0, math.log(100))

    def fit(self):
        K = self.cfg.grad_accum
        for epoch in range(self.cfg.epochs):
            batches = list(self.micro_batches(epoch))
            n_windows = len(batches) // K
            for w in range(n_windows):
                for k in range(K):
                    self.forward_backward(*batches[w * K + k], sync=(k == K - 1))
                self.optimizer_step()

    def digest(self):
        h = hashlib.sha256()
        for _, p in self.raw_model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        for _, p in self.criterion.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def worker(rank: int, cfg: TrainConfig):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world_size)
    trainer = ClipTrainer(cfg, rank)
    trainer.fit()
    if rank == 0:
        print("FINAL_SHA256", trainer.digest(), flush=True)
        if os.environ.get("PARAM_DUMP"):
            named = list(trainer.raw_model.named_parameters()) + list(trainer.criterion.named_parameters())
            torch.save({n: p.detach().clone() for n, p in named}, os.environ["PARAM_DUMP"])
    dist.destroy_process_group()


if __name__ == "__main__":
    cfg = TrainConfig()
    mp.spawn(worker, args=(cfg,), nprocs=cfg.world_size, join=True)
