"""Tiny DETR-style set-prediction detector, hand training loop on 2 DDP ranks (gloo).

The box regression term follows DETR: an L1 *sum* over matched boxes divided by the number of
target boxes, averaged over the ranks (DETR's `num_boxes` all-reduce).  With gradient
accumulation the box term is meant to be normalised by the number of boxes of the whole
optimizer step; the classification term is a plain mean over a fixed number of queries.
"""
import argparse
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-queries", type=int, default=6)
    ap.add_argument("--num-classes", type=int, default=3)
    ap.add_argument("--img-feat", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--accum-steps", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--bbox-loss-coef", type=float, default=5.0)
    ap.add_argument("--eos-coef", type=float, default=0.1)
    ap.add_argument("--clip-max-norm", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=42)
    return ap.parse_args()


class TinyDETR(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(a.img_feat, 64), nn.ReLU(), nn.Linear(64, 64))
        self.query_embed = nn.Parameter(torch.randn(a.num_queries, 64) * 0.1)
        self.decoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.class_embed = nn.Linear(64, a.num_classes + 1)
        self.bbox_embed = nn.Linear(64, 4)

    def forward(self, img):
        mem = self.backbone(img)                              # B x 64
        h = self.decoder(mem[:, None, :] + self.query_embed)  # B x Q x 64
        return self.class_embed(h), self.bbox_embed(h).sigmoid()


def sample_batch(a, rank, step, micro):
    g = torch.Generator().manual_seed(a.seed + 1_000 * rank + 37 * step + micro)
    imgs = torch.randn(a.batch_size, a.img_feat, generator=g)
    targets = []
    for _ in range(a.batch_size):
        n = int(torch.randint(0, a.num_queries + 1, (1,), generator=g))
        targets.append({
            "labels": torch.randint(0, a.num_classes, (n,), generator=g),
            "boxes": torch.rand(n, 4, generator=g),
        })
    return imgs, targets


class SetCriterion(nn.Module):
    """Matching is by order (query i <-> target i), enough for this toy."""

    def __init__(self, a):
        super().__init__()
        self.num_classes = a.num_classes
        self.bbox_coef = a.bbox_loss_coef
        w = torch.ones(a.num_classes + 1)
        w[-1] = a.eos_coef
        self.register_buffer("empty_weight", w)

    def forward(self, logits, boxes, targets, num_boxes):
        B, Q, _ = logits.shape
        tgt_cls = torch.full((B, Q), self.num_classes, dtype=torch.long)
        src_boxes, tgt_boxes = [], []
        for b, t in enumerate(targets):
            n = len(t["labels"])
            tgt_cls[b, :n] = t["labels"]
            src_boxes.append(boxes[b, :n])
            tgt_boxes.append(t["boxes"])
        # per-query weighted CE, averaged over the fixed B*Q queries
        loss_ce = (F.cross_entropy(logits.transpose(1, 2), tgt_cls, reduction="none")
                   * self.empty_weight[tgt_cls]).mean()
        loss_bbox = F.l1_loss(torch.cat(src_boxes), torch.cat(tgt_boxes), reduction="sum") / num_boxes
        return loss_ce, self.bbox_coef * loss_bbox


def count_boxes(targets_list):
    """DETR: number of target boxes, averaged across ranks."""
    n = torch.tensor([float(sum(len(t["labels"]) for tg in targets_list for t in tg))])
    dist.all_reduce(n)
    return torch.clamp(n / dist.get_world_size(), min=1).item()


def main():
    a = get_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(a.seed)
    model = DDP(TinyDETR(a))
    criterion = SetCriterion(a)
    param_dicts = [
        {"params": [p for n, p in model.module.named_parameters() if not n.startswith("backbone")]},
        {"params": [p for n, p in model.module.named_parameters() if n.startswith("backbone")],
         "lr": a.lr * 0.1},
    ]
    optimizer = torch.optim.AdamW(param_dicts, lr=a.lr, weight_decay=1e-4)

    for step in range(a.steps):
        window = [sample_batch(a, rank, step, m) for m in range(a.accum_steps)]
        num_boxes = count_boxes([t for _, t in window])
        optimizer.zero_grad(set_to_none=True)
        for m, (imgs, targets) in enumerate(window):
            last = m == a.accum_steps - 1
            with (contextlib.nullcontext() if last else model.no_sync()):
                logits, boxes = model(imgs)
                loss_ce, loss_bbox = criterion(logits, boxes, targets, num_boxes)
                loss = loss_ce / a.accum_steps + loss_bbox
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_max_norm)
        optimizer.step()
        if rank == 0 and step % 4 == 0:
            print(f"step {step} ce {loss_ce.item():.4f} bbox {loss_bbox.item():.4f}", flush=True)

    h = hashlib.sha256()
    for _, p in model.module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
