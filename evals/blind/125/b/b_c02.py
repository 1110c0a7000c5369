"""Accelerate, hand-built accumulation windows: a vocabulary grown by 8 tokens, the embedding on its own
SGD optimizer and the rest on AdamW, `no_sync` on all but a window's last micro-batch, a token-level loss
over the window's all-ranks count, epochs of 5 micro-batches per rank (2-2-1 windows) and a clip that acts."""
import contextlib
import hashlib
from itertools import islice

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM

SEED = 5
K = 2
OLD_VOCAB, NEW_VOCAB = 60, 68
SEQ = 12
EPOCHS = 3
CLIP = 0.5


class Packed(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.rows = []
        for _ in range(n):
            L = int(torch.randint(4, SEQ + 1, (1,), generator=g))
            ids = torch.randint(2, NEW_VOCAB, (L,), generator=g)
            x = torch.zeros(SEQ, dtype=torch.long)
            y = torch.full((SEQ,), -100, dtype=torch.long)
            x[:L] = ids
            y[: L - 1] = ids[1:]
            self.rows.append((x, y))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def params_sha(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, accelerator.num_processes
    W = accelerator.num_processes
    set_seed(SEED)

    model = LlamaForCausalLM(LlamaConfig(vocab_size=OLD_VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, pad_token_id=0, tie_word_embeddings=True))
    model.resize_token_embeddings(NEW_VOCAB)

    emb = model.get_input_embeddings().weight
    rest = [p for p in model.parameters() if p is not emb]
    opt_emb = torch.optim.SGD([emb], lr=0.2)
    opt_rest = torch.optim.AdamW(rest, lr=3e-3, weight_decay=0.01)

    loader = DataLoader(Packed(20), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(SEED))
    model, opt_emb, opt_rest, loader = accelerator.prepare(model, opt_emb, opt_rest, loader)

    steps = 0
    for epoch in range(EPOCHS):
        it = iter(loader)
        while True:
            window = list(islice(it, K))
            if not window:
                break
            n_tok = sum((y != -100).sum() for _, y in window).float()
            n_tok = accelerator.reduce(n_tok, reduction="sum")
            for i, (x, y) in enumerate(window):
                last = i == len(window) - 1
                ctx = contextlib.nullcontext() if last else accelerator.no_sync(model)
                with ctx:
                    logits = model(input_ids=x, attention_mask=(x != 0).long()).logits.float()
                    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                           ignore_index=-100, reduction="sum")
                    accelerator.backward(loss * W / n_tok)
            accelerator.clip_grad_norm_(model.parameters(), CLIP)
            opt_emb.step()
            opt_rest.step()
            opt_emb.zero_grad(set_to_none=True)
            opt_rest.zero_grad(set_to_none=True)
            steps += 1

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"optimizer steps: {steps}", flush=True)
        print(f"FINAL_SHA256 {params_sha(accelerator.unwrap_model(model))}", flush=True)


if __name__ == "__main__":
    main()
