"""Sequence classification with a LoRA adapter on a tiny GPT-2, Accelerate on 2 processes.

accumulate() with K = 2, a prepared linear schedule (sized in optimizer steps x processes, as
Accelerate steps a prepared scheduler once per process), clipping only on sync steps, a
DataLoader worker process and a trainable `score` head through `modules_to_save`.
"""
import hashlib

import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, TaskType, get_peft_model
from transformers import GPT2Config, GPT2ForSequenceClassification, get_linear_schedule_with_warmup

SEED, VOCAB, LEN, N, BS, K, EPOCHS = 17, 80, 12, 160, 4, 2, 2


class Toy(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(SEED)
        self.x = torch.randint(1, VOCAB, (N, LEN), generator=g)
        self.y = (self.x[:, :3].sum(-1) % 3)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}


def main():
    accelerator = Accelerator(gradient_accumulation_steps=K, cpu=True)
    set_seed(SEED)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=LEN, n_embd=32, n_layer=2, n_head=4, num_labels=3,
                     pad_token_id=0, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = get_peft_model(GPT2ForSequenceClassification(cfg),
                           LoraConfig(task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8, lora_dropout=0.0,
                                      target_modules=["c_attn", "c_fc"], fan_in_fan_out=True))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loader = DataLoader(Toy(), batch_size=BS, shuffle=True, num_workers=1,
                        generator=torch.Generator().manual_seed(SEED))
    # N / W / BS = 20 micro-batches per rank per epoch -> 10 updates per epoch
    updates = EPOCHS * (N // (accelerator.num_processes * BS)) // K
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=2 * accelerator.num_processes,
                                            num_training_steps=updates * accelerator.num_processes)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)

    model.train()
    for _ in range(EPOCHS):
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss  # every micro-batch has BS samples: a per-batch mean is exact
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 0.3)
                opt.step()
                sched.step()
                opt.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        net = accelerator.unwrap_model(model)
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in net.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
