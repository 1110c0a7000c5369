"""Small built-in model and deterministic synthetic data (no downloads, ever).

Token-level data with padding and an ignore index, so every micro-batch and
every rank holds a different number of valid tokens: the setting in which
mean-of-means bugs (F5, F6) show up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["IGNORE_INDEX", "TokenMLP", "TinyCausalLM", "make_rank_batches", "make_lm_batches",
           "token_loss", "count_tokens"]

IGNORE_INDEX = -100


class TokenMLP(nn.Module):
    """Per-token classifier: embedding → MLP → vocabulary logits. Tiny and fast on CPU."""

    def __init__(self, vocab: int = 32, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc2(torch.tanh(self.fc1(self.embed(tokens))))
        return logits


def token_loss(model: nn.Module, batch: dict[str, torch.Tensor]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of per-token cross-entropies over valid tokens, and the number of valid tokens."""
    logits = model(batch["tokens"])
    labels = batch["labels"]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (labels != IGNORE_INDEX).sum()


def count_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Valid (non-ignored) tokens of a micro-batch: the ``count_fn`` for :func:`token_loss`."""
    return (batch["labels"] != IGNORE_INDEX).sum()


def make_rank_batches(*, seed: int, world_size: int, micro_batches: int, micro_batch_size: int = 4,
                      seq_len: int = 12, vocab: int = 32, uneven: bool = True,
                      vary_batch_size: bool = False) -> list[list[dict[str, torch.Tensor]]]:
    """``out[rank][i]``: micro-batch i of ``rank``; identical on every process for one seed.

    ``uneven`` gives each sequence a random valid length (padding labelled
    :data:`IGNORE_INDEX`); ``vary_batch_size`` also varies the number of rows.
    """
    g = torch.Generator().manual_seed(seed)
    out: list[list[dict[str, torch.Tensor]]] = []
    for _ in range(world_size):
        rank_batches = []
        for _ in range(micro_batches):
            rows = micro_batch_size
            if vary_batch_size:
                rows = int(torch.randint(1, micro_batch_size + 1, (1,), generator=g))
            tokens = torch.randint(0, vocab, (rows, seq_len), generator=g)
            labels = torch.roll(tokens, -1, dims=1) * 7 % vocab
            if uneven:
                lengths = torch.randint(1, seq_len + 1, (rows,), generator=g)
                mask = torch.arange(seq_len)[None, :] >= lengths[:, None]
                labels = labels.masked_fill(mask, IGNORE_INDEX)
            rank_batches.append({"tokens": tokens, "labels": labels})
        out.append(rank_batches)
    return out


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        mlp: torch.Tensor = self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return x + mlp


class TinyCausalLM(nn.Module):
    """A tiny GPT-style causal language model (about 0.2 M parameters by default).

    Deterministic (no dropout), so the fp64 reference and the fp32 ranks see
    the same function. ``blocks`` is a ``ModuleList`` so FSDP2 can shard block
    by block, as it would a real model.
    """

    def __init__(self, vocab: int = 64, dim: int = 64, layers: int = 2, heads: int = 4,
                 hidden: int = 256, max_len: int = 32) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def make_lm_batches(*, seed: int, world_size: int, micro_batches: int,
                    micro_batch_size: int = 4, seq_len: int = 32, vocab: int = 64,
                    min_len: int = 4) -> list[list[dict[str, torch.Tensor]]]:
    """Synthetic next-token data with structure to learn: ``out[rank][i]``, same on every process.

    Each sequence follows a random affine rule ``x[t+1] = (a·x[t] + c) mod vocab``
    (a few rules, so the model has something to fit and the loss falls),
    has a random valid length in ``[min_len, seq_len]`` and is right-padded;
    padded positions and the last valid position are labelled
    :data:`IGNORE_INDEX`. Valid-token counts therefore differ between
    micro-batches and ranks, which is what exposes mean-of-means bugs.
    """
    g = torch.Generator().manual_seed(seed)
    rules = torch.tensor([[1, 1], [3, 5], [5, 2], [7, 3]])
    out: list[list[dict[str, torch.Tensor]]] = []
    for _ in range(world_size):
        rank_batches = []
        for _ in range(micro_batches):
            rows = micro_batch_size
            start = torch.randint(0, vocab, (rows,), generator=g)
            rule = rules[torch.randint(0, len(rules), (rows,), generator=g)]
            seq = [start]
            for _ in range(seq_len - 1):
                seq.append((rule[:, 0] * seq[-1] + rule[:, 1]) % vocab)
            tokens = torch.stack(seq, dim=1)
            lengths = torch.randint(min_len, seq_len + 1, (rows,), generator=g)
            pos = torch.arange(seq_len)[None, :]
            tokens = tokens.masked_fill(pos >= lengths[:, None], 0)
            labels = torch.roll(tokens, -1, dims=1)
            labels = labels.masked_fill(pos >= lengths[:, None] - 1, IGNORE_INDEX)
            rank_batches.append({"tokens": tokens, "labels": labels})
        out.append(rank_batches)
    return out
