# corpus: style=timm class=OK
# a timm-style loss scaler: unscale, clip and step all under need_update
import torch


class ScalerWithClip:
    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, need_update=True):
        self._scaler.scale(loss).backward()
        if need_update:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()


loss_scaler = ScalerWithClip()
for i, (x, y) in enumerate(loader):
    boundary = (i + 1) % accum_iter == 0
    loss = criterion(model(x), y) / accum_iter
    loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters(),
                need_update=boundary)
    if boundary:
        optimizer.zero_grad()
