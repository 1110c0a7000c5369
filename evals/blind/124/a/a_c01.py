"""DeepSpeed ZeRO-1 token-level LM step: ragged sequences, the loss normalised by the
number of real tokens in the whole window on all ranks (read ahead), clip that acts."""
import hashlib
import itertools

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, SEQ, MICRO, GA, STEPS, SEED = 80, 32, 12, 4, 4, 20, 3
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": GA,
    "zero_optimization": {"stage": 1},
    "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0, "torch_adam": True}},
    "steps_per_print": 100000,
}


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(2 * DIM, DIM)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        e = self.emb(ids)
        prev = F.pad(e, (0, 0, 1, 0))[:, :-1]
        return self.out(torch.tanh(self.mix(torch.cat([e, prev], -1))))


def micro_batches(rank):
    g = torch.Generator().manual_seed(SEED * 100 + rank)
    while True:
        ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
        lens = torch.randint(2, SEQ + 1, (MICRO,), generator=g)
        labels = ids.roll(-1, 1).clone()
        pos = torch.arange(SEQ)[None]
        labels[pos >= (lens[:, None] - 1)] = -100
        yield ids, labels


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    model = TinyLM()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=DS_CONFIG)
    stream = micro_batches(rank)
    for _ in range(STEPS):
        window = list(itertools.islice(stream, GA))
        n_tok = torch.tensor(float(sum(int((lab != -100).sum()) for _, lab in window)))
        dist.all_reduce(n_tok)  # real tokens in the window, all ranks
        for ids, labels in window:
            logits = engine(ids)
            loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100, reduction="sum")
            # the engine divides by GA and averages over ranks: undo both
            engine.backward(loss_sum * GA * world / n_tok)
            engine.step()
    final = [(n, p.detach().float().contiguous()) for n, p in engine.module.named_parameters()]
    h = hashlib.sha256()
    for _, t in final:
        h.update(t.numpy().tobytes())
    if rank == 0:
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
