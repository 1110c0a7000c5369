# corpus: style=nanogpt class=OK
# a flat loop over micro-batches stepping every K-th one, then a large-batch reference loop
# with its own optimizer after it: the reference's step is not a flush of the training's
# partial window
import torch


def train_and_check(model, ref, make_opt, get_batch, max_iters, grad_accum):
    optimizer = make_opt(model)
    micro_batches = (get_batch(i) for i in range(max_iters * grad_accum))
    optimizer.zero_grad(set_to_none=True)
    for step, (X, Y) in enumerate(micro_batches):
        loss = model(X, Y) / grad_accum
        loss.backward()
        if (step + 1) % grad_accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    ref_opt = make_opt(ref)
    for it in range(max_iters):
        batches = [get_batch(it * grad_accum + m) for m in range(grad_accum)]
        X = torch.cat([b[0] for b in batches])
        Y = torch.cat([b[1] for b in batches])
        ref_opt.zero_grad(set_to_none=True)
        ref(X, Y).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
