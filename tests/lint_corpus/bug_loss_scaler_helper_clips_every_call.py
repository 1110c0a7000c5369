# corpus: style=timm class=F8
# a timm-style loss scaler: the step is under need_update, the clip is not, so every
# micro-batch clips the window's partial sum
import torch


class ScalerWithClip:
    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, need_update=True):
        self._scaler.scale(loss).backward()
        if clip_grad is not None:
            self._scaler.unscale_(optimizer)  # expect: AG105
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)  # expect: AG105, AG324
        if need_update:
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
