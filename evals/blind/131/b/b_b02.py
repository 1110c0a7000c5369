"""Sequence classification with LoRA under Accelerate (bf16 autocast, K = 8).

The backbone is kept in bf16 to save memory; only the adapters and the
classification head are trained.
"""
import argparse
import hashlib

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, TaskType, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForSequenceClassification, get_linear_schedule_with_warmup


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n-train", type=int, default=192)
    ap.add_argument("--seed", type=int, default=31)
    return ap.parse_args()


def make_data(n, seq, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq), generator=g)
    # label: whether the sequence holds more "high" than "low" tokens
    y = ((ids >= vocab // 2).sum(1) > seq // 2).long()
    return TensorDataset(ids, y)


def build_model(seed):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=80, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      num_labels=2, pad_token_id=0)
    base = LlamaForSequenceClassification(cfg).to(torch.bfloat16)
    lcfg = LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "up_proj"])
    return get_peft_model(base, lcfg)


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    a = parse()
    acc = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=a.grad_accum)
    assert acc.num_processes == 2, acc.num_processes
    set_seed(a.seed)
    model = build_model(a.seed)

    ds = make_data(a.n_train, 20, 80, a.seed + 1)
    dl = DataLoader(ds, batch_size=a.micro_batch, shuffle=False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0)
    steps = a.epochs * a.n_train // (a.micro_batch * a.grad_accum * acc.num_processes)
    sched = get_linear_schedule_with_warmup(opt, 2 * acc.num_processes, steps * acc.num_processes)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)

    model.train()
    for epoch in range(a.epochs):
        for ids, y in dl:
            with acc.accumulate(model):
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=y)
                acc.backward(out.loss)
                opt.step()
                sched.step()
                opt.zero_grad()
        acc.print(f"epoch {epoch} loss {out.loss.item():.4f}")

    if acc.is_main_process:
        print("FINAL_SHA256", final_sha(acc.unwrap_model(model)), flush=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
