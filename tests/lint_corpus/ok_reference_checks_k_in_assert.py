# corpus: style=nanogpt class=OK
# the reference replays what each rank recorded, one optimizer step per iteration of the
# training run: K is named only in an assert and a print that check and report the
# window's size, so the loop is one large batch per step, not an accumulation loop
import torch


def replay(model, recorded, n_iters, gradient_accumulation_steps, world_size, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for it in range(n_iters):
        xs = [x for (i, x, _) in recorded if i == it]
        ys = [y for (i, _, y) in recorded if i == it]
        assert len(xs) == gradient_accumulation_steps * world_size
        print(f"iter {it}: {len(xs)} micro-batches (K={gradient_accumulation_steps})")
        _, loss = model(torch.cat(xs), torch.cat(ys))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model
