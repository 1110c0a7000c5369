# corpus: style=ddp class=F11
# the sync flag is a name assigned from the counter before it is incremented: true on the
# first micro-step of each window, so that one all-reduces and the stepping one does not
import contextlib

import torch


def train(ddp, model, opt, loader, accum=2, max_norm=1.0):
    micro_step = 0
    for batch in loader:
        sync_now = micro_step % accum == 0
        with contextlib.nullcontext() if sync_now else ddp.no_sync():  # expect: AG111
            loss = ddp(batch).mean() / accum
            loss.backward()
        micro_step += 1
        if micro_step % accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
