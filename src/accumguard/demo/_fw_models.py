"""The tiny models, seeded token data, summed losses and the fp64 reference comparison that
``accumguard demo --frameworks`` and tests/integrations share (models from configs, never
downloaded; uneven valid-token counts across micro-steps and ranks)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from accumguard.verify.reference import reference_run, relative_update_error

#: one micro-batch (token ids and labels), and a model's parameters by name
Batch = dict[str, torch.Tensor]
Params = dict[str, torch.Tensor]
#: a summed loss and the count it sums over
LossFn = Callable[[torch.nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]

__all__ = ["BROKEN_MIN", "EXACT_TOL", "IGNORE", "SEQ", "VOCAB", "Batch", "LossFn", "Params",
           "count_tokens", "hf_samples", "mean_loss", "plain", "shifted_sum_loss", "sum_loss",
           "tiny_gpt2", "tiny_llama", "token_samples", "update_errors"]

VOCAB = 64
SEQ = 12
IGNORE = -100
# fp32 target vs fp64 reference, relative to the update: the mission's criterion.
EXACT_TOL = 1e-5
# A broken default must be off by at least this much for the comparison to mean anything.
BROKEN_MIN = 1e-2


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    """A 2-layer Llama with a 64-token vocabulary (about 20 k parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=1,
                      pad_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def tiny_gpt2(seed: int = 0) -> torch.nn.Module:
    """A 2-layer GPT-2 with a 64-token vocabulary, no dropout (deterministic)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=1)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg)


def token_samples(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """``n`` sequences with a random number (1..SEQ) of valid, position-aligned targets.

    ``labels[t]`` is the target of position t (already aligned: no shift needed), so every
    micro-batch, and every rank, holds a different number of valid tokens.
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        labels = (torch.roll(ids, -1) * 7 + 3) % VOCAB
        valid = int(torch.randint(1, SEQ + 1, (1,), generator=g))
        labels[valid:] = IGNORE
        out.append({"input_ids": ids, "labels": labels})
    return out


def hf_samples(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """HF-style causal-LM samples: ``labels = input_ids`` with right padding -100 (the model
    or the loss shifts them), 2..SEQ labelled positions each."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        labels = ids.clone()
        labels[int(torch.randint(2, SEQ + 1, (1,), generator=g)):] = IGNORE
        out.append({"input_ids": ids, "labels": labels})
    return out


def count_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return (batch["labels"] != IGNORE).sum()


def sum_loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over valid (aligned) targets, and their count."""
    logits = model(input_ids=batch["input_ids"]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                           batch["labels"].reshape(-1), ignore_index=IGNORE, reduction="sum")
    return loss, count_tokens(batch)


def shifted_sum_loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token CE over valid shifted labels (HF convention), and their count."""
    logits = model(input_ids=batch["input_ids"]).logits[..., :-1, :]
    labels = batch["labels"][..., 1:]
    s = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                        ignore_index=IGNORE, reduction="sum")
    return s, (labels != IGNORE).sum()


def mean_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The usual per-micro-batch token mean (the F5 setting when accumulated)."""
    s, n = sum_loss(model, batch)
    return s / torch.as_tensor(n)


def plain(batch: dict[str, object]) -> Batch:
    """A detached CPU copy of a micro-batch, to replay it in the reference."""
    return {k: v.detach().cpu().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}


def update_errors(model: torch.nn.Module,
                  make_opt: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
                  make_sched: Callable[[torch.optim.Optimizer], object],
                  rank_windows: list[list[list[Batch]]], snapshots: list[Params],
                  loss_fn: LossFn = sum_loss, max_grad_norm: float | None = None) -> list[float]:
    """Relative update error after every step vs the fp64 large-batch reference.

    ``rank_windows[r][j]`` lists the micro-batches rank r consumed in optimizer step j.
    """
    steps = len(rank_windows[0])
    assert all(len(w) == steps for w in rank_windows), [len(w) for w in rank_windows]
    windows = [[b for rank in rank_windows for b in rank[j]] for j in range(steps)]
    ref = reference_run(model, make_opt, windows, loss_fn, make_scheduler=make_sched,
                        max_grad_norm=max_grad_norm)
    assert len(snapshots) == len(ref.params), (len(snapshots), len(ref.params))
    return [relative_update_error(ref.initial, s, r) for s, r in zip(snapshots, ref.params,
                                                                    strict=True)]


