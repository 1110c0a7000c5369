"""Accelerate with two prepared modules and two optimizers: a LoRA tiny Llama (LM loss) and a
separate value head on its last hidden state (MSE), both in one `accumulate()`, each clipped at
the boundary. Frozen base including the embedding. GA 2, 2 ranks.
"""
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

SEED, VOCAB, SEQ, K = 3, 64, 12, 2


def data():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randint(1, VOCAB, (96, SEQ), generator=g)
    x[:, 6:] = (x[:, :6] * 7) % VOCAB
    y = (x.float().mean(1, keepdim=True) / VOCAB)  # a scalar "value" target
    return TensorDataset(x, y)


def main():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=K)
    assert acc.num_processes == 2
    set_seed(SEED)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=4, max_position_embeddings=32))
    lm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                         target_modules=["q_proj", "v_proj"]))
    head = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))
    opt_lm = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-2)
    opt_head = torch.optim.SGD(head.parameters(), lr=5e-2, momentum=0.9)
    loader = DataLoader(data(), batch_size=2, shuffle=False)
    lm, head, opt_lm, opt_head, loader = acc.prepare(lm, head, opt_lm, opt_head, loader)

    for epoch in range(2):
        for ids, y in loader:
            with acc.accumulate(lm, head):
                out = lm(input_ids=ids, labels=ids, output_hidden_states=True)
                v = head(out.hidden_states[-1][:, -1])
                loss = out.loss + 0.5 * F.mse_loss(v, y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_([p for p in lm.parameters() if p.requires_grad], 0.3)
                    acc.clip_grad_norm_(head.parameters(), 0.3)
                opt_lm.step()
                opt_head.step()
                opt_lm.zero_grad()
                opt_head.zero_grad()

    if acc.is_main_process:
        h = hashlib.sha256()
        for m in (acc.unwrap_model(lm), acc.unwrap_model(head)):
            for _, p in m.named_parameters():
                h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
