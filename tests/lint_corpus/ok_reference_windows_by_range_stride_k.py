# corpus: style=ddp class=OK
# the single-process reference walks the recorded micro-batches one window at a time:
# range(0, n_micro, K) with K = cfg.accum (a name that is not spelled "accum"), one
# backward and one step per window; the loop's iterable names n_micro, but each
# iteration is a whole window, not a micro-batch
import torch


def reference(cfg, model, micro):
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    K = cfg.accum
    n_micro = len(micro)
    for start in range(0, n_micro, K):
        xs = torch.cat([x for x, _ in micro[start:start + K]])
        ys = torch.cat([y for _, y in micro[start:start + K]])
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model
