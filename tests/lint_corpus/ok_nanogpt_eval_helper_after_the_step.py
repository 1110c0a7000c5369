# corpus: style=nanogpt class=OK
"""nanoGPT with a validation helper that frees the gradients before evaluating, run after the
optimizer step (between windows) whenever the last window passed its micro-batch mark."""
import torch

gradient_accumulation_steps = 4
eval_every_micro = 6


def main(model, optimizer, get_batch, max_iters, estimate_loss):
    def run_eval():
        optimizer.zero_grad(set_to_none=True)
        return estimate_loss()

    micro_num = 0
    for iter_num in range(max_iters):
        for micro_step in range(gradient_accumulation_steps):
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            x, y = get_batch("train")
            _, loss = model(x, y)
            (loss / gradient_accumulation_steps).backward()
            micro_num += 1
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if micro_num % eval_every_micro < gradient_accumulation_steps:
            run_eval()
