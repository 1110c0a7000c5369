"""DPO on a LoRA adapter (plus a trained copy of lm_head) on Accelerate, clipped at 0.5,
with DeepSpeed's WarmupDecayLR class used as a plain scheduler kept out of `prepare`
and stepped by hand once per update.
"""
import hashlib
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from deepspeed.runtime.lr_schedules import WarmupDecayLR
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

SEED, BETA, LR = 3, 0.2, 2e-3
MICRO, ACCUM, EPOCHS, N_PAIRS = 2, 2, 4, 24
PROMPT, MAXC = 3, 7
CLIP = 0.5


def make_pairs(vocab):
    g = torch.Generator().manual_seed(SEED)
    L = PROMPT + MAXC
    rows = []
    for _ in range(N_PAIRS):
        prompt = torch.randint(3, vocab, (PROMPT,), generator=g)
        pair = []
        for _ in range(2):
            n = int(torch.randint(1, MAXC + 1, (1,), generator=g))
            ids = torch.zeros(L, dtype=torch.long)
            ids[:PROMPT] = prompt
            ids[PROMPT:PROMPT + n] = torch.randint(3, vocab, (n,), generator=g)
            m = torch.zeros(L, dtype=torch.long)
            m[:PROMPT + n] = 1
            lab = torch.full((L,), -100)
            lab[PROMPT:PROMPT + n] = ids[PROMPT:PROMPT + n]
            pair.append((ids, m, lab))
        rows.append(pair)
    return rows


def collate(rows):
    out = {}
    for j, key in enumerate(("chosen", "rejected")):
        out[key + "_ids"] = torch.stack([r[j][0] for r in rows])
        out[key + "_mask"] = torch.stack([r[j][1] for r in rows])
        out[key + "_labels"] = torch.stack([r[j][2] for r in rows])
    return out


def seq_logps(model, ids, mask, labels):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    lab = labels[:, 1:]
    lp = torch.gather(logits.log_softmax(-1), 2, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (lp * (lab != -100)).sum(-1)


def dpo_loss(model, unwrapped, batch):
    ids = torch.cat([batch["chosen_ids"], batch["rejected_ids"]])
    mask = torch.cat([batch["chosen_mask"], batch["rejected_mask"]])
    labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]])
    n = batch["chosen_ids"].shape[0]
    with torch.no_grad(), unwrapped.disable_adapter():
        ref = seq_logps(model, ids, mask, labels)
    pol = seq_logps(model, ids, mask, labels)
    margin = (pol[:n] - ref[:n]) - (pol[n:] - ref[n:])
    return -F.logsigmoid(BETA * margin).mean()


def main():
    torch.use_deterministic_algorithms(True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
    set_seed(SEED)
    cfg = LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj"],
        modules_to_save=["lm_head"], init_lora_weights="gaussian"))
    loader = DataLoader(make_pairs(cfg.vocab_size), batch_size=MICRO, collate_fn=collate)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    # not prepared: Accelerate will not wrap it, so it advances only when we step it
    updates = EPOCHS * (len(loader) // accelerator.num_processes) // ACCUM
    scheduler = WarmupDecayLR(optimizer, total_num_steps=updates, warmup_min_lr=0.0, warmup_max_lr=LR,
                              warmup_num_steps=2, warmup_type="linear")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    unwrapped = accelerator.unwrap_model(model)

    for epoch in range(EPOCHS):
        model.train()
        for batch in loader:
            with accelerator.accumulate(model):
                loss = dpo_loss(model, unwrapped, batch)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), CLIP)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                scheduler.step()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in unwrapped.named_parameters()])
        if os.environ.get("DUMP_PARAMS"):
            torch.save(flat, os.environ["DUMP_PARAMS"])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
