"""Accelerate + PEFT LoRA on a tiny Llama, with a hand-rolled linear warm-up.

Answer-only SFT, fixed-length rows, K = 4 micro-batches per optimizer step.
"""
import argparse
import hashlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad_accum", type=int, default=4)
    ap.add_argument("--micro_bs", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-2)
    ap.add_argument("--warmup_updates", type=int, default=4)
    ap.add_argument("--n_rows", type=int, default=32)
    return ap.parse_args()


def make_data(n, seq=16, prompt=6, vocab=80, seed=7):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq), generator=g)
    labels = ids.clone()
    labels[:, :prompt] = -100
    return TensorDataset(ids, labels)


def warmup_lr(base_lr, update, warmup):
    return base_lr * min(1.0, (update + 1) / warmup)


def main():
    args = parse()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
    assert accelerator.num_processes == 2
    set_seed(0)

    cfg = LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr, momentum=0.9)
    loader = DataLoader(make_data(args.n_rows), batch_size=args.micro_bs, shuffle=True,
                        generator=torch.Generator().manual_seed(3))
    model, opt, loader = accelerator.prepare(model, opt, loader)

    completed_steps = 0
    model.train()
    for epoch in range(args.epochs):
        for ids, labels in loader:
            with accelerator.accumulate(model):
                logits = model(input_ids=ids).logits
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                       labels[:, 1:].reshape(-1), ignore_index=-100)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    for group in opt.param_groups:
                        group["lr"] = warmup_lr(args.lr, accelerator.step, args.warmup_updates)
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
