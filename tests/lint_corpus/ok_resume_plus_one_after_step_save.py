# corpus: style=nanogpt class=OK
# the checkpoint is written after the iteration's update, before the counter moves: the
# saved counter is the iteration just run, and the resume's + 1 is the next one
import torch


def save_checkpoint(model, optimizer, step, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step}, path)


def train(model, optimizer, get_batch, grad_accum, max_steps, path, resume=False):
    step = 0
    if resume:
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"] + 1
    while step < max_steps:
        for micro in range(grad_accum):
            loss = model(*get_batch(step, micro)) / grad_accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 and step > 0:
            save_checkpoint(model, optimizer, step, path)
        step += 1
