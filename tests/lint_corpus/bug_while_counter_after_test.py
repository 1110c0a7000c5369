# corpus: style=while_loop class=F13
# The counter is bumped at the end of the iteration, after the test.
micro_batches_seen = 0
accumulate_every = 8
data = iter(loader)
while micro_batches_seen < max_micro_batches:
    inputs, labels = next(data)
    loss = criterion(net(inputs), labels) / accumulate_every
    loss.backward()
    if micro_batches_seen % accumulate_every == 0:  # expect: AG115
        opt.step()
        opt.zero_grad()
    micro_batches_seen += 1
