# corpus: style=ddp class=OK
# the sync flag is a name assigned from the counter before it is incremented, on the
# micro-step that completes the window: the stepping micro-step all-reduces
import contextlib

import torch


def train(ddp, model, opt, loader, accum=2, max_norm=1.0):
    micro_step = 0
    for batch in loader:
        sync_now = (micro_step + 1) % accum == 0
        with contextlib.nullcontext() if sync_now else ddp.no_sync():
            loss = ddp(batch).mean() / accum
            loss.backward()
        micro_step += 1
        if micro_step % accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
