# corpus: style=accelerate class=OK
# the same windows with the Accelerator no longer syncing at the loader's end
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin

K = 3
acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False))
model, opt, loader = acc.prepare(model, opt, loader)


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


for epoch in range(2):
    for win in windows(loader, K):
        n = acc.gather(count(win)).sum()
        for batch in win:
            with acc.accumulate(model):
                acc.backward(token_sum(model, batch) * K * acc.num_processes / n)
                opt.step()
                opt.zero_grad()
