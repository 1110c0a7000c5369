# corpus: style=trainer_class class=OK
# a trainer method all-reduces the window's sample and token counts together and returns
# both; the loop unpacks them (n_samples, n_tokens = ...) and divides each term by its
# global count, times W for DDP's average: nothing rank-local
import contextlib

import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, model, optimizer, world_size, k):
        self.model, self.optimizer, self.world, self.k = model, optimizer, world_size, k

    def _window_counts(self, batches):
        local = torch.tensor([sum(float(b[0].shape[0]) for b in batches),
                              sum(float((b[2] != -100).sum()) for b in batches)])
        dist.all_reduce(local)
        return local[0], local[1]

    def fit_window(self, batches):
        n_samples, n_tokens = self._window_counts(batches)
        for m, (x, y, labels) in enumerate(batches):
            last = m == len(batches) - 1
            with contextlib.nullcontext() if last else self.model.no_sync():
                cls_logits, tok_logits = self.model(x)
                cls_sum = torch.nn.functional.cross_entropy(cls_logits, y, reduction="sum")
                tok_sum = torch.nn.functional.cross_entropy(
                    tok_logits.flatten(0, 1), labels.flatten(), reduction="sum", ignore_index=-100)
                loss = (cls_sum / n_samples + 0.5 * tok_sum / n_tokens) * self.world
                loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def main(model, optimizer, loader, k=3):
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    trainer = Trainer(ddp, optimizer, dist.get_world_size(), k)
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == k:
            trainer.fit_window(window)
            window = []
