# corpus: style=accelerate class=F1
# the window is drawn ahead for its token count; the data's size is a product named first
# (n_rows = BS * K * W * updates) and handed to the dataset builder: exactly cfg["updates"]
# windows per rank, so the last window's batches all come after the loader's end
from accelerate import Accelerator
from torch.utils.data import DataLoader

CFG = dict(micro_bs=3, grad_accum=2, updates=4)


def main():
    c = CFG
    acc = Accelerator(cpu=True, gradient_accumulation_steps=c["grad_accum"])
    W, K = acc.num_processes, c["grad_accum"]
    n_rows = c["micro_bs"] * K * W * c["updates"]
    dl = DataLoader(make_rows(n_rows), batch_size=c["micro_bs"], collate_fn=collate)
    model, opt, dl = acc.prepare(build(), make_opt(), dl)
    it = iter(dl)
    for update in range(c["updates"]):
        batch_samples = [next(it) for _ in range(K)]
        num_items = acc.gather(count_items(batch_samples)).sum()
        for b in batch_samples:
            with acc.accumulate(model):  # expect: AG148
                acc.backward(loss_sum(model, b) * K * W / num_items)
                opt.step()
                opt.zero_grad()
