# corpus: style=timm class=OK
# timm-style train_one_epoch: need_update flag, backward inside local closures, no_sync
import time
from contextlib import suppress


def train_one_epoch(model, loader, optimizer, loss_fn, args, lr_scheduler=None, loss_scaler=None):
    has_no_sync = hasattr(model, "no_sync")
    accum_steps = args.grad_accum_steps
    last_batch_idx = len(loader) - 1
    num_updates = 0
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0

        def _forward():
            with suppress():
                loss = loss_fn(model(input), target)
            return loss / accum_steps

        def _backward(_loss):
            if loss_scaler is not None:
                loss_scaler(_loss, optimizer, clip_grad=args.clip_grad, need_update=need_update)
            else:
                _loss.backward()
                if need_update:
                    optimizer.step()

        if has_no_sync and not need_update:
            with model.no_sync():
                loss = _forward()
                _backward(loss)
        else:
            loss = _forward()
            _backward(loss)

        if not need_update:
            continue
        num_updates += 1
        optimizer.zero_grad()
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates)
        time.time()
