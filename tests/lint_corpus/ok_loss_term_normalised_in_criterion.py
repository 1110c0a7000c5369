# corpus: style=ddp class=OK
import contextlib

import torch
import torch.nn.functional as F



class Criterion(torch.nn.Module):
    def forward(self, logits, labels, pred_boxes, boxes, num_boxes):
        ce = F.cross_entropy(logits, labels)
        l1 = F.l1_loss(pred_boxes, boxes, reduction="sum") / num_boxes
        return ce, l1


def train(model, batches, opt, steps, accum_steps=4):
    criterion = Criterion()
    for step in range(steps):
        window = [next(batches) for _ in range(accum_steps)]
        num_boxes = sum(b.shape[0] for _, _, b in window)
        for m, (x, labels, boxes) in enumerate(window):
            with contextlib.nullcontext() if m == accum_steps - 1 else model.no_sync():
                logits, pred_boxes = model(x)
                ce, l1 = criterion(logits, labels, pred_boxes, boxes, num_boxes)
                loss = ce / accum_steps + l1
                loss.backward()
        opt.step()
        opt.zero_grad()
