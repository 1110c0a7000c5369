# corpus: style=ddp class=F11
# Two DDP models under one `with`: the conditional expression binds to the critic only, so
# the actor's no_sync() is entered on every micro-step and the actor never synchronises.
import contextlib


def train(actor, critic, opt_a, opt_c, batches, k=4):
    for i, batch in enumerate(batches):
        sync = (i + 1) % k == 0
        with actor.no_sync(), critic.no_sync() if not sync else contextlib.nullcontext():  # expect: AG111
            loss = actor(batch).mean() / k + critic(batch).pow(2).mean() / k
            loss.backward()
        if sync:
            opt_a.step()
            opt_c.step()
            opt_a.zero_grad()
            opt_c.zero_grad()
