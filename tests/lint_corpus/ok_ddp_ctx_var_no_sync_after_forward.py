# corpus: style=hf class=OK
# The no_sync context is chosen after the forward and wraps only the backward: DDP has
# already armed the all-reduce, so every micro-step syncs. Correct, a note only.
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, optimizer, scheduler, dataloader, args):
    model = DDP(model, device_ids=[args.local_rank])
    for step, batch in enumerate(dataloader):
        outputs = model(**batch)
        loss = outputs.loss / args.gradient_accumulation_steps
        do_step = (step + 1) % args.gradient_accumulation_steps == 0
        sync_ctx = contextlib.nullcontext() if do_step else model.no_sync()
        with sync_ctx:  # expect: AG116
            loss.backward()
        if do_step:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
