# corpus: style=plain class=OK
# Windows pre-grouped by a helper: each inner list is one window.
def windows(it, k):
    buf = []
    for item in it:
        buf.append(item)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


for window in windows(loader, accumulation_steps):
    n = sum(len(b) for b in window)
    for b in window:
        (model(b).sum() / n).backward()
    optimizer.step()
    optimizer.zero_grad()
