"""LoRA fine-tune of a tiny Llama with Accelerate (no_trainer style)."""
import argparse
import hashlib

import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--gradient_accumulation_steps", type=int, default=2)
    p.add_argument("--per_device_train_batch_size", type=int, default=2)
    p.add_argument("--num_train_epochs", type=int, default=2)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--seq_len", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def build_model():
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM", init_lora_weights="gaussian")
    return get_peft_model(base, lora)


def make_data(n, seq_len, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (n, seq_len), generator=g)
    ids[:, 1::2] = (ids[:, ::2] * 3 + 1) % 128  # learnable structure
    return TensorDataset(ids)


def main():
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(args.seed)
    model = build_model()
    ds = make_data(32, args.seq_len, args.seed)
    loader = DataLoader(ds, batch_size=args.per_device_train_batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=args.learning_rate, weight_decay=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    for epoch in range(args.num_train_epochs):
        for (ids,) in loader:
            with accelerator.accumulate(model):
                out = model(input_ids=ids, labels=ids)
                accelerator.backward(out.loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        net = accelerator.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
