"""Accelerate + PEFT LoRA fine-tuning of a bf16 base model (memory-saving recipe)."""
import argparse
import hashlib

import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro_batch_size", type=int, default=2)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--num_samples", type=int, default=640)
    ap.add_argument("--seq_len", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()


def build_model(seq_len):
    cfg = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq_len)
    base = LlamaForCausalLM(cfg).to(torch.bfloat16)   # base weights stay in bf16 to save memory
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, init_lora_weights="gaussian",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return get_peft_model(base, lora, autocast_adapter_dtype=True)


def main():
    args = parse_args()
    set_seed(args.seed)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    assert accelerator.num_processes == 2

    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, 96, (args.num_samples, args.seq_len), generator=g)
    loader = DataLoader(TensorDataset(ids), batch_size=args.micro_batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))

    model = build_model(args.seq_len)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                            weight_decay=0.0)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    model.train()
    for (batch,) in loader:
        with accelerator.accumulate(model):
            out = model(input_ids=batch, labels=batch)
            accelerator.backward(out.loss)
            opt.step()
            opt.zero_grad()

    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
