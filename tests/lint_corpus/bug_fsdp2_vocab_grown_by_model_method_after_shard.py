# corpus: style=fsdp2 class=F10
# the model's own method replaces its embedding after fully_shard(model): the new embedding
# is a plain tensor on every rank, outside every FSDP2 unit, never reduced
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class TinyLM(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab)

    def grow_vocab(self, n_new):
        new = nn.Embedding(self.embed.num_embeddings + n_new, self.embed.embedding_dim)
        new.weight.data[: self.embed.num_embeddings] = self.embed.weight.data
        self.embed = new


class Trainer:
    def __init__(self, n_new):
        self.model = TinyLM(64, 32)
        fully_shard(self.model)
        self.setup_vocab(n_new)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def setup_vocab(self, n_new):
        self.model.grow_vocab(n_new)  # expect: AG196
