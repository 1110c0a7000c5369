"""Accelerate + LoRA: forward under accumulate(), backward/step after the block exits."""
import hashlib
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

K = 3
CLIP = 0.05


def data(n=72, seq=16, vocab=128, seed=11):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq), generator=g)
    labels = ids.clone()
    labels[:, :5] = -100
    return TensorDataset(ids, labels)


def main():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=K)
    assert acc.num_processes == 2
    set_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0,
                                                             target_modules=["q_proj", "k_proj", "v_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    dl = DataLoader(data(), batch_size=3, shuffle=True, num_workers=1,
                    generator=torch.Generator().manual_seed(0))
    model, opt, dl = acc.prepare(model, opt, dl)

    model.train()
    for epoch in range(2):
        for ids, labels in dl:
            # Only the forward runs inside the context; DDP decides about the reduction at the forward.
            with acc.accumulate(model):
                out = model(input_ids=ids, labels=labels)
            acc.backward(out.loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad()

    if acc.is_main_process:
        m = acc.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in m.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        torch.save({n: p.detach().clone() for n, p in m.named_parameters()},
                   f"tmp_scratch/{os.path.splitext(os.path.basename(__file__))[0]}.pt")
    acc.end_training()


if __name__ == "__main__":
    main()
