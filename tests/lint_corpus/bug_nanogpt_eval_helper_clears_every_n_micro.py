# corpus: style=nanogpt class=F3
"""nanoGPT with a validation helper that frees the gradients (zero_grad) before evaluating,
run every 6 micro-batches inside windows of 4: it erases the window's gradient so far
(blind round 124 c_b02)."""
import torch

gradient_accumulation_steps = 4
eval_every_micro = 6


def main(model, optimizer, get_batch, max_iters, estimate_loss):
    def run_eval():
        optimizer.zero_grad(set_to_none=True)  # expect: AG102
        return estimate_loss()

    micro_num = 0
    for iter_num in range(max_iters):
        for micro_step in range(gradient_accumulation_steps):
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            x, y = get_batch("train")
            _, loss = model(x, y)
            (loss / gradient_accumulation_steps).backward()
            micro_num += 1
            if micro_num % eval_every_micro == 0:
                run_eval()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
