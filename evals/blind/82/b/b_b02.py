"""Tiny causal LM on synthetic token streams, DeepSpeed ZeRO-2 on 2 ranks.

The LR schedule (linear warm-up, then linear decay) is handed to DeepSpeed through
the config, so the engine owns and steps it.
"""
import hashlib
from dataclasses import dataclass

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler


@dataclass
class TrainConfig:
    vocab_size: int = 64
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    n_sequences: int = 192
    micro_batch_size: int = 4
    grad_accum_steps: int = 4
    epochs: int = 3
    peak_lr: float = 3e-3
    warmup_steps: int = 4
    weight_decay: float = 0.0
    seed: int = 7


class TokenStream(Dataset):
    def __init__(self, cfg: TrainConfig):
        g = torch.Generator().manual_seed(cfg.seed + 100)
        # a noisy "count up by a random stride" language
        start = torch.randint(0, cfg.vocab_size, (cfg.n_sequences, 1), generator=g)
        stride = torch.randint(1, 4, (cfg.n_sequences, 1), generator=g)
        pos = torch.arange(cfg.seq_len + 1).unsqueeze(0)
        toks = (start + stride * pos) % cfg.vocab_size
        noise = torch.rand(toks.shape, generator=g) < 0.1
        toks[noise] = torch.randint(0, cfg.vocab_size, (int(noise.sum()),), generator=g)
        self.toks = toks

    def __len__(self):
        return self.toks.shape[0]

    def __getitem__(self, i):
        return self.toks[i, :-1], self.toks[i, 1:]


class TinyLM(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, 4 * cfg.d_model,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(cfg.seq_len),
                             persistent=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t))
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        logits = self.lm_head(self.ln(h))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def deepspeed_config(cfg: TrainConfig, total_num_steps: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.grad_accum_steps,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 2, "overlap_comm": False,
                              "contiguous_gradients": True},
        "zero_allow_untested_optimizer": True,
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": cfg.peak_lr,
                "warmup_num_steps": cfg.warmup_steps,
                "warmup_type": "linear",
                "total_num_steps": total_num_steps,
            },
        },
        "steps_per_print": 10_000,
    }


def param_digest(module: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = TrainConfig()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)

    dataset = TokenStream(cfg)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=cfg.seed)
    loader = DataLoader(dataset, batch_size=cfg.micro_batch_size, sampler=sampler,
                        drop_last=True)

    # schedule horizon: the whole run
    total_num_steps = cfg.epochs * len(loader)

    model = TinyLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.peak_lr,
                                  betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    engine, _, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config(cfg, total_num_steps))

    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        for idx, targets in loader:
            loss = engine(idx, targets)
            engine.backward(loss)
            engine.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e} "
                  f"step {engine.global_steps}")

    digest = param_digest(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}")
    dist.barrier()


if __name__ == "__main__":
    main()
