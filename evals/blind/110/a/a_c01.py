"""Answer-only SFT with a LoRA+ optimizer (B matrices at a higher LR) on Accelerate.

Windows are read ahead so every micro-batch's token sum is normalised by the
window's target count; the clip runs once per update, on the summed gradient.
"""
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from transformers import LlamaConfig, LlamaForCausalLM, get_scheduler
from peft import LoraConfig, get_peft_model

HP = SimpleNamespace(seed=5, lr=1.5e-3, loraplus_ratio=8.0, K=3, micro_bs=2, epochs=3, n=36,
                     seq=14, max_grad_norm=0.3, warmup=1)


class AnswerOnly(Dataset):
    def __init__(self, n, seq, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            ids = torch.randint(3, vocab, (seq,), generator=g)
            plen = int(torch.randint(2, seq - 2, (1,), generator=g))
            labels = ids.clone()
            labels[:plen] = -100
            self.rows.append((ids, labels))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def loraplus_groups(model, lr, ratio):
    a, b = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (b if "lora_B" in name else a).append(p)
    return [{"params": a, "lr": lr}, {"params": b, "lr": lr * ratio}]


def token_nll_sum(logits, labels):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                           ignore_index=-100, reduction="sum")


def main():
    torch.use_deterministic_algorithms(True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
        num_steps=HP.K, sync_with_dataloader=False))
    set_seed(HP.seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "gate_proj"],
        init_lora_weights="gaussian"))
    optimizer = torch.optim.AdamW(loraplus_groups(model, HP.lr, HP.loraplus_ratio), weight_decay=0.01)
    loader = DataLoader(AnswerOnly(HP.n, HP.seq, cfg.vocab_size, HP.seed), batch_size=HP.micro_bs)
    updates = HP.epochs * (len(loader) // accelerator.num_processes // HP.K)
    # a prepared scheduler advances num_processes times per update
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=HP.warmup * accelerator.num_processes,
                              num_training_steps=updates * accelerator.num_processes)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    for epoch in range(HP.epochs):
        model.train()
        it = iter(loader)
        for _ in range(len(loader) // HP.K):
            window = [next(it) for _ in range(HP.K)]
            local = torch.tensor(float(sum(int((lab[:, 1:] != -100).sum()) for _, lab in window)))
            # mean over ranks of the window's target count: N / W, so no extra x W
            per_rank_targets = accelerator.reduce(local, reduction="mean")
            for ids, labels in window:
                # the prepared optimizer clears only if the previous micro-step was a sync step,
                # i.e. at the first micro-step of each window
                optimizer.zero_grad()
                with accelerator.accumulate(model):
                    logits = model(input_ids=ids).logits
                    loss = token_nll_sum(logits, labels) * HP.K / per_rank_targets
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), HP.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        m = accelerator.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in m.named_parameters()])
        if os.environ.get("DUMP_PARAMS"):
            torch.save(flat, os.environ["DUMP_PARAMS"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    accelerator.end_training()


if __name__ == "__main__":
    main()
