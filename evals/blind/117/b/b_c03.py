"""Accelerate GA=2 under bf16 autocast on a tiny Mistral: gradient checkpointing, frozen token embedding,
prepared warm-up/cosine schedule and a clip that acts on the window's gradient."""
import hashlib

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import MistralConfig, MistralForCausalLM, get_cosine_schedule_with_warmup

torch.use_deterministic_algorithms(True)
GA, EPOCHS, BS = 2, 3, 2


def main():
    acc = Accelerator(gradient_accumulation_steps=GA, mixed_precision="bf16", cpu=True)
    set_seed(0)
    cfg = MistralConfig(vocab_size=72, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                        sliding_window=None)
    model = MistralForCausalLM(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.model.embed_tokens.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.01)
    ids = torch.randint(0, 72, (32, 12), generator=torch.Generator().manual_seed(5))  # equal lengths: mean / GA is exact
    dl = DataLoader(TensorDataset(ids), batch_size=BS, shuffle=False)
    updates = len(dl) // acc.num_processes // GA * EPOCHS  # 8 micro-batches per rank -> 4 updates per epoch
    sched = get_cosine_schedule_with_warmup(opt, 2 * acc.num_processes, updates * acc.num_processes)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)

    for epoch in range(EPOCHS):
        model.train()
        for (x,) in dl:
            with acc.accumulate(model):
                loss = model(input_ids=x, labels=x).loss
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 0.2)
                opt.step()
                sched.step()
                opt.zero_grad()

    acc.wait_for_everyone()
    if acc.is_main_process:
        m = acc.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in m.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
