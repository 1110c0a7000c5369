"""Imbalanced intent classifier, DeepSpeed ZeRO-3, class-weighted cross-entropy.

The objective is the class-weighted mean over every sample of an optimizer
window on all ranks (what F.cross_entropy(weight=...) gives on the whole
window). Micro-batches are grouped by utterance length, so their class mix
(and total weight) differs from one micro-batch to the next.
"""
import argparse
import hashlib
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--grad-accum", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


class BagClassifier(nn.Module):
    def __init__(self, vocab, dim, classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.emb(tokens).mean(dim=1)
        return self.out(torch.tanh(self.proj(h)))


def build_micro_batches(args, rank, world):
    """Length-bucketed micro-batches; labels skewed towards class 0."""
    g = torch.Generator().manual_seed(args.seed + 1000)
    total = args.steps * args.grad_accum * world
    batches = []
    for i in range(total):
        length = 4 + (i % 5) * 3
        labels = torch.multinomial(torch.tensor([0.55, 0.2, 0.12, 0.08, 0.05]),
                                   args.micro_batch, replacement=True, generator=g)
        toks = torch.randint(0, args.vocab, (args.micro_batch, length), generator=g)
        toks[:, 0] = labels * 7  # a weak cue
        batches.append((toks, labels))
    # window s, micro-step k, rank r -> global index (s * K + k) * W + r
    return [batches[j] for j in range(rank, total, world)]


def main():
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    class_weight = torch.tensor([0.3, 1.0, 1.5, 2.5, 4.0])
    ds_config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.0,
                                                  "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10 ** 9,
    }
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = BagClassifier(args.vocab, args.dim, args.classes)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config)

    micro = build_micro_batches(args, rank, world)
    K = args.grad_accum
    for step in range(args.steps):
        window = micro[step * K:(step + 1) * K]
        # total class weight of this window over all ranks (logged, and the
        # normaliser of the objective)
        w_tot = torch.stack([class_weight[y].sum() for _, y in window]).sum()
        dist.all_reduce(w_tot)
        for toks, labels in window:
            logits = engine(toks)
            # weighted sum over the window's weight; the engine divides by K
            # and averages over ranks, so scale back by K * W
            loss = F.cross_entropy(logits, labels, weight=class_weight,
                                   reduction="sum") * K * world / w_tot
            engine.backward(loss)
            engine.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} window_weight {w_tot.item():.1f} loss {loss.item():.4f}")

    params = [p for _, p in engine.module.named_parameters()]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        if rank == 0:
            h = hashlib.sha256()
            for _, p in engine.module.named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
            print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
