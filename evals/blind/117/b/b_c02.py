"""PEFT LoRA classifier with Accelerate, hand accumulation under no_sync, AdamW (adapter) + SGD (head),
micro-batches of varying size per rank, each window normalised over its all-ranks sample count."""
import contextlib
import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, TaskType, get_peft_model
from transformers import LlamaConfig, LlamaForSequenceClassification

torch.use_deterministic_algorithms(True)
K = 4
STEPS = 6
SIZES = {0: [3, 1, 4, 2], 1: [5, 6, 2, 3]}  # samples per micro-batch, cycled


def main():
    acc = Accelerator(cpu=True)  # accumulation done by hand
    set_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      num_labels=3, pad_token_id=0)
    model = get_peft_model(LlamaForSequenceClassification(cfg),
                           LoraConfig(task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8, lora_dropout=0.0,
                                      target_modules=["q_proj", "v_proj"], init_lora_weights="gaussian"))
    head = [p for n, p in model.named_parameters() if p.requires_grad and "score" in n]
    lora = [p for n, p in model.named_parameters() if p.requires_grad and "score" not in n]
    opt_lora = torch.optim.AdamW(lora, lr=2e-3, weight_decay=0.0)
    opt_head = torch.optim.SGD(head, lr=0.05, momentum=0.9)
    model, opt_lora, opt_head = acc.prepare(model, opt_lora, opt_head)

    gen = torch.Generator().manual_seed(10 + acc.process_index)
    sizes = SIZES[acc.process_index]
    mb = 0
    for step in range(STEPS):
        window = []
        for _ in range(K):
            n = sizes[mb % len(sizes)]
            mb += 1
            x = torch.randint(1, 64, (n, 9), generator=gen)
            y = torch.randint(0, 3, (n,), generator=gen)
            window.append((x, y))
        n_window = torch.tensor(float(sum(len(y) for _, y in window)))
        dist.all_reduce(n_window)  # all ranks' samples in this window
        for i, (x, y) in enumerate(window):
            ctx = acc.no_sync(model) if i < K - 1 else contextlib.nullcontext()
            with ctx:
                logits = model(input_ids=x).logits
                loss = F.cross_entropy(logits, y, reduction="sum") * acc.num_processes / n_window
                acc.backward(loss)
        opt_lora.step()
        opt_head.step()
        opt_lora.zero_grad()
        opt_head.zero_grad()

    acc.wait_for_everyone()
    if acc.is_main_process:
        m = acc.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in m.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
