"""LoRA fine-tuning of a bf16 GPT-2-style model with Accelerate gradient accumulation."""
import argparse
import hashlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--grad-accum", type=int, default=8)
    p.add_argument("--micro-bs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--n-samples", type=int, default=320)
    p.add_argument("--seq-len", type=int, default=16)
    return p.parse_args()


def build_model(args):
    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    base = GPT2LMHeadModel(cfg).to(torch.bfloat16)
    lora = LoraConfig(r=args.rank, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)
    return get_peft_model(base, lora, autocast_adapter_dtype=False)


def make_loader(args):
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, 128, (args.n_samples, args.seq_len), generator=g)
    return DataLoader(TensorDataset(ids), batch_size=args.micro_bs, shuffle=True,
                      generator=torch.Generator().manual_seed(args.seed))


def lm_loss(model, ids):
    logits = model(input_ids=ids).logits.float()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def main():
    args = get_args()
    set_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
    model = build_model(args)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    loader = make_loader(args)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    model.train()
    n_updates = 0
    for (ids,) in loader:
        with accelerator.accumulate(model):
            loss = lm_loss(model, ids)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            n_updates += 1

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
