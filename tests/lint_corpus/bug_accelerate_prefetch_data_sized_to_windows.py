# corpus: style=accelerate class=F1
# the window is drawn ahead for its token count, over data built for exactly N_UPDATES windows
# per rank, while the Accelerator keeps sync_with_dataloader: the last window's K batches all
# come after the loader's end and each one steps the optimizer
from accelerate import Accelerator
from torch.utils.data import DataLoader

N_UPDATES, GRAD_ACCUM, WORLD, MICRO_BS = 6, 4, 2, 8

accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)
dataset = SyntheticText(N_UPDATES * GRAD_ACCUM * WORLD * MICRO_BS)
loader = DataLoader(dataset, batch_size=MICRO_BS)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
it = iter(loader)
for update in range(N_UPDATES):
    window = [next(it) for _ in range(GRAD_ACCUM)]
    n_tokens = accelerator.gather(sum_tokens(window)).sum()
    for batch in window:
        with accelerator.accumulate(model):  # expect: AG148
            accelerator.backward(token_loss_sum(model, batch) / n_tokens * GRAD_ACCUM * WORLD)
            optimizer.step()
            optimizer.zero_grad()
