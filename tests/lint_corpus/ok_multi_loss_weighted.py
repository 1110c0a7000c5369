# corpus: style=multi_loss class=OK
import torch

accum = 2
for i, batch in enumerate(loader):
    pred_cls, pred_box = model(batch.images)
    loss_cls = cls_loss(pred_cls, batch.labels)
    loss_box = box_loss(pred_box, batch.boxes)
    loss = (loss_cls + 0.5 * loss_box) / accum
    loss.backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
