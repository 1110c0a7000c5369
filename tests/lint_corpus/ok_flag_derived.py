# corpus: style=plain class=OK
import torch


def run(model, optimizer, scheduler, loader, cfg):
    K = cfg.accumulate_every
    optimizer.zero_grad(set_to_none=True)
    for it, batch in enumerate(loader):
        update = (it + 1) % K == 0
        flush = it == len(loader) - 1
        apply_now = update or flush
        loss = model(batch) / K
        loss.backward()
        if apply_now:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
