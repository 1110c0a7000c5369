# corpus: style=fsdp2 class=OK
# the vocabulary grown by the model's own method before fully_shard(model): FSDP2 shards the
# new embedding with the rest
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
        self.setup_vocab(n_new)
        fully_shard(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def setup_vocab(self, n_new):
        self.model.grow_vocab(n_new)
