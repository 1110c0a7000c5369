# corpus: style=accelerate class=F1
# a generator groups the prepared loader's batches by K before accumulate() runs on them:
# the last window is read whole after the loader's last batch, so every micro-step syncs
from accelerate import Accelerator

K = 3
acc = Accelerator(gradient_accumulation_steps=K)
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
            with acc.accumulate(model):  # expect: AG148
                acc.backward(token_sum(model, batch) * K * acc.num_processes / n)
                opt.step()
                opt.zero_grad()
