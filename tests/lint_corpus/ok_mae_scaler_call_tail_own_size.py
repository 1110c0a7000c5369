# corpus: style=mae class=OK
# MAE-style loop: a loss-scaler object runs backward and, when told, the step (not on every
# micro-batch); the pass's short last window is stepped, each loss divided by its own size
import torch


class NativeScalerWithGradNormCount:
    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, update_grad=True):
        self._scaler.scale(loss).backward()
        if update_grad:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()


def train_one_epoch(model, data_loader, optimizer, loss_scaler, args):
    accum_iter = args.accum_iter
    optimizer.zero_grad()
    for data_iter_step, (samples, targets) in enumerate(data_loader):
        loss = torch.nn.functional.mse_loss(model(samples), targets)
        start = (data_iter_step // accum_iter) * accum_iter
        loss /= min(accum_iter, len(data_loader) - start)
        last = (data_iter_step + 1) % accum_iter == 0 or data_iter_step + 1 == len(data_loader)
        loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters(),
                    update_grad=last)
        if last:
            optimizer.zero_grad()


def main(model, data_loader, optimizer, args):
    loss_scaler = NativeScalerWithGradNormCount()
    for _ in range(args.epochs):
        train_one_epoch(model, data_loader, optimizer, loss_scaler, args)
