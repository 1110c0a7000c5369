"""Accelerate, GA 3, worker DataLoader, ragged sequences: a token-level loss over each window's
all-ranks count (x K x processes: Accelerate divides by K, DDP averages), a short last window
per epoch (3-3-1), and a clip that acts at the boundary."""
import hashlib
from dataclasses import dataclass
import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import GPT2Config, GPT2LMHeadModel


@dataclass
class Cfg:
    K: int = 3
    bs: int = 2
    n: int = 28            # 7 micro-batches per rank
    epochs: int = 2
    lr: float = 2e-3
    clip: float = 0.25
    vocab: int = 90


class Ragged(Dataset):
    def __init__(self, c):
        g = torch.Generator().manual_seed(21)
        self.items = [torch.randint(1, c.vocab, (int(torch.randint(4, 25, (1,), generator=g)),), generator=g) for _ in range(c.n)]
    def __len__(self): return len(self.items)
    def __getitem__(self, i): return self.items[i]


def collate(seqs):
    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long); lab = torch.full((len(seqs), L), -100)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s; lab[i, :len(s)] = s
    return ids, lab


def token_loss_sum(logits, labels):
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100, reduction="sum")


def main():
    c = Cfg()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=c.K)
    assert acc.num_processes == 2
    set_seed(4)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=c.vocab, n_embd=48, n_layer=2, n_head=4, n_positions=64,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr)
    dl = DataLoader(Ragged(c), batch_size=c.bs, shuffle=True, num_workers=1, collate_fn=collate,
                    generator=torch.Generator().manual_seed(8), persistent_workers=False)
    model, opt, dl = acc.prepare(model, opt, dl)

    for _ in range(c.epochs):
        it = iter(dl)
        per_rank = len(dl)
        done = 0
        while done < per_rank:
            window = [next(it) for _ in range(min(c.K, per_rank - done))]
            done += len(window)
            n_local = sum(int(lab[:, 1:].ne(-100).sum()) for _, lab in window)
            n_all = acc.gather(torch.tensor([n_local])).sum().item()
            for ids, lab in window:
                with acc.accumulate(model):
                    s = token_loss_sum(model(input_ids=ids).logits, lab)
                    acc.backward(s * c.K * acc.num_processes / n_all)
                    if acc.sync_gradients:
                        acc.clip_grad_norm_(model.parameters(), c.clip)
                    opt.step()
                    opt.zero_grad()
            assert acc.sync_gradients

    acc.wait_for_everyone()
    if acc.is_main_process:
        h = hashlib.sha256()
        for _, p in acc.unwrap_model(model).named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
