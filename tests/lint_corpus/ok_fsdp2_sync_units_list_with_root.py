# corpus: style=fsdp2 class=OK
# every unit turned back on one by one with recurse=False, the root among them
import torch
from torch.distributed.fsdp import fully_shard


def train(model, loader, opt, accum=4):
    fully_shard(model.encoder)
    fully_shard(model.decoder)
    fully_shard(model)
    toggled = [model.encoder, model.decoder, model]
    for step, window in enumerate(loader):
        model.set_requires_gradient_sync(False)
        for i, (x, y) in enumerate(window):
            if i == accum - 1:
                for m in toggled:
                    m.set_requires_gradient_sync(True, recurse=False)
            loss = torch.nn.functional.cross_entropy(model(x), y) / accum
            loss.backward()
        opt.step()
        opt.zero_grad()
