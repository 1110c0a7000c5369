"""LoRA fine-tuning of a tiny GPT-2 with Accelerate on ragged, padded sequences.

Each optimizer step covers a window of K micro-batches per rank. The window is read ahead so the
loss can be a token *sum* over the window's all-ranks target count. Accelerate divides every
backward by K and DDP averages over the ranks, so the sum is scaled back by K * world size.
bf16 autocast, an unprepared LambdaLR stepped only on sync steps, a clip that acts.
"""
import hashlib
import os
from itertools import islice

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

SEED, K, MICRO_BS, EPOCHS, SEQ, VOCAB, PAD = 31, 3, 3, 2, 18, 60, 0
N_ROWS = 2 * MICRO_BS * 12            # 12 micro-batches per rank per epoch -> 4 windows
CLIP = 0.25


def ragged_corpus():
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(1, VOCAB, (N_ROWS, SEQ), generator=g)
    lens = torch.randint(4, SEQ + 1, (N_ROWS,), generator=g)
    ids[torch.arange(SEQ)[None, :] >= lens[:, None]] = PAD
    return TensorDataset(ids)


def windows(loader, k):
    it = iter(loader)
    while True:
        w = list(islice(it, k))
        if not w:
            return
        yield w


def main():
    plugin = GradientAccumulationPlugin(num_steps=K, adjust_scheduler=False, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_plugin=plugin)
    assert accelerator.num_processes == 2
    set_seed(SEED)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0, target_modules=["c_attn", "c_fc"],
                                            fan_in_fan_out=True, modules_to_save=["lm_head"]))
    loader = DataLoader(ragged_corpus(), batch_size=MICRO_BS, shuffle=True,
                        generator=torch.Generator().manual_seed(SEED))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-3, weight_decay=0.0)
    total_steps = EPOCHS * (len(loader) // (accelerator.num_processes * K))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 2) * (1 - s / (total_steps + 1)))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    world = accelerator.num_processes
    for epoch in range(EPOCHS):
        model.train()
        for window in windows(loader, K):
            n_local = sum(int((b[0][:, 1:] != PAD).sum()) for b in window)
            n_window = accelerator.reduce(torch.tensor(float(n_local)), reduction="sum")
            for (ids,) in window:
                with accelerator.accumulate(model):
                    with accelerator.autocast():
                        logits = model(input_ids=ids, attention_mask=(ids != PAD).long()).logits
                    tgt = ids[:, 1:].masked_fill(ids[:, 1:] == PAD, -100)
                    tok_sum = F.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), tgt.reshape(-1),
                                              ignore_index=-100, reduction="sum")
                    accelerator.backward(tok_sum / n_window * (K * world))
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), CLIP)
                    optimizer.step()
                    optimizer.zero_grad()
                if accelerator.sync_gradients:
                    schedule.step()
        accelerator.print(f"epoch {epoch} lr {schedule.get_last_lr()[0]:.2e} loss/tok {tok_sum.detach().item() / max(1, n_local):.3f}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        final = accelerator.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in final.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("B128_DUMP"):
            torch.save({n: p.detach().float().clone() for n, p in final.named_parameters()}, os.environ["B128_DUMP"])
    accelerator.end_training()


if __name__ == "__main__":
    main()
