# corpus: style=ddp class=OK
# Two DDP models whose no_sync() contexts are both chosen by the condition (an ExitStack):
# both synchronise at the window's last micro-step.
import contextlib


def train(actor, critic, opt_a, opt_c, batches, k=4):
    for i, batch in enumerate(batches):
        sync = (i + 1) % k == 0
        with contextlib.ExitStack() as stack:
            if not sync:
                stack.enter_context(actor.no_sync())
                stack.enter_context(critic.no_sync())
            loss = actor(batch).mean() / k + critic(batch).pow(2).mean() / k
            loss.backward()
        if sync:
            opt_a.step()
            opt_c.step()
            opt_a.zero_grad()
            opt_c.zero_grad()
