"""Accelerate, one model with two optimizers (AdamW for the backbone, SGD for a new head),
a frozen token embedding, two prepared warm-up schedulers and a global clip that acts.

Rows are fixed length with a fixed number of supervised positions, so each micro-batch's mean
divided by K (done by accelerator.backward) is the window mean.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2Model

K, MICRO_BS, EPOCHS, N_ROWS, SEQ, VOCAB, N_CLS = 4, 2, 2, 32, 12, 50, 5


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = GPT2Model(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        self.head = nn.Linear(32, N_CLS)

    def forward(self, ids):
        return self.head(self.backbone(input_ids=ids).last_hidden_state)


def main():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=K)
    assert accelerator.num_processes == 2
    set_seed(0)
    model = Tagger()
    model.backbone.wte.weight.requires_grad_(False)

    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, VOCAB, (N_ROWS, SEQ), generator=g)
    tags = ids % N_CLS
    loader = DataLoader(TensorDataset(ids, tags), batch_size=MICRO_BS, shuffle=True,
                        generator=torch.Generator().manual_seed(1))

    body = [p for p in model.backbone.parameters() if p.requires_grad]
    opt_body = torch.optim.AdamW(body, lr=3e-3, weight_decay=0.01)
    opt_head = torch.optim.SGD(model.head.parameters(), lr=0.2, momentum=0.9)

    updates = EPOCHS * (N_ROWS // (MICRO_BS * accelerator.num_processes)) // K
    warm = 3
    # a prepared scheduler advances num_processes times per optimizer step: size it in those ticks
    ticks = lambda t: min(1.0, (t // accelerator.num_processes + 1) / warm)  # noqa: E731
    sch_body, sch_head = LambdaLR(opt_body, ticks), LambdaLR(opt_head, ticks)

    model, opt_body, opt_head, sch_body, sch_head, loader = accelerator.prepare(
        model, opt_body, opt_head, sch_body, sch_head, loader)

    model.train()
    done = 0
    for _ in range(EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x).reshape(-1, N_CLS), y.reshape(-1))
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.25)
                for o, s in ((opt_body, sch_body), (opt_head, sch_head)):
                    o.step()
                    s.step()
                    o.zero_grad()
            done += int(accelerator.sync_gradients)
    assert done == updates

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
