"""LoRA+ SFT with Accelerate: two learning rates (A vs B matrices), a DataLoader worker,
GA 3 over 8-batch epochs (windows 3-3-2) with the short tail rescaled, and a clip on
the synchronised gradient only."""
import hashlib
import os
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

CFG = SimpleNamespace(seed=99, vocab=64, seq=12, n=32, micro=2, K=3, epochs=2, lr=2e-3,
                      loraplus_ratio=8.0, clip=0.01)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                   os.path.splitext(os.path.basename(__file__))[0])


class Rows(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(CFG.seed + 5)
        self.x = torch.randint(0, CFG.vocab, (CFG.n, CFG.seq), generator=g)

    def __len__(self):
        return CFG.n

    def __getitem__(self, i):
        return self.x[i]


def loraplus_groups(model):
    a, b = [], []
    for n, p in model.named_parameters():
        if p.requires_grad:
            (b if "lora_B" in n else a).append(p)
    return [{"params": a, "lr": CFG.lr}, {"params": b, "lr": CFG.lr * CFG.loraplus_ratio}]


def window_len(pos, n_batches, k):
    start = (pos // k) * k
    return min(k, n_batches - start)


def main():
    torch.use_deterministic_algorithms(True)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=CFG.K)
    assert acc.num_processes == 2
    torch.manual_seed(CFG.seed)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=CFG.vocab, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                            fan_in_fan_out=True, lora_dropout=0.0,
                                            init_lora_weights="gaussian"))
    opt = torch.optim.AdamW(loraplus_groups(model), weight_decay=0.01)
    loader = DataLoader(Rows(), batch_size=CFG.micro, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(CFG.seed))
    model, opt, loader = acc.prepare(model, opt, loader)
    n_batches = len(loader)  # 8 per rank
    steps = 0
    for epoch in range(CFG.epochs):
        for pos, ids in enumerate(loader):
            with acc.accumulate(model):
                loss = model(input_ids=ids, labels=ids).loss
                # accelerate divides by K; the epoch's last window has fewer micro-batches
                loss = loss * CFG.K / window_len(pos, n_batches, CFG.K)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), CFG.clip)
                    steps += 1
                opt.step()
                opt.zero_grad()
    if acc.is_main_process:
        m = acc.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        os.makedirs(OUT, exist_ok=True)
        torch.save({n: p.detach().float().clone() for n, p in m.named_parameters()},
                   os.path.join(OUT, "final_params.pt"))
        print(f"optimizer steps={steps}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
