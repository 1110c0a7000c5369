"""Accelerate + PEFT LoRA sequence classifier, partially labelled data, 2 ranks.

- LoRA on q/v with the classification head trained in full (PEFT's modules_to_save).
- Only some rows carry a label (-100 = unlabelled). The objective is the mean CE over the
  labelled rows of a whole window on all ranks: a cheap counting pass over the prepared
  loader gathers every micro-batch's labelled count first.
- 10 micro-batches per rank per epoch at K = 4: windows 4-4-2 (accumulate() closes the
  window at the loader's end). accelerator.backward divides by K, so each micro-batch
  loss is sum * K * W / window_count.
- a prepared cosine schedule sized in optimizer steps x processes, a clip of 0.5.
"""
import hashlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForSequenceClassification, get_scheduler


class Cfg:
    n_rows = 80
    seq_len = 16
    vocab = 64
    n_labels = 3
    micro_batch = 4
    K = 4
    epochs = 3
    lr = 4e-3
    clip = 0.5
    seed = 17


def make_data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(1, cfg.vocab, (cfg.n_rows, cfg.seq_len), generator=g)
    labels = (ids[:, :4].sum(-1) % cfg.n_labels)
    unlabelled = torch.rand(cfg.n_rows, generator=g) < 0.35
    labels[unlabelled] = -100
    return TensorDataset(ids, labels)


def window_counts(accelerator, loader, K):
    """All-ranks labelled count of every window of one pass (window = K micro-batches)."""
    counts = []
    for i, (_, labels) in enumerate(loader):
        n = accelerator.gather((labels != -100).sum().reshape(1)).sum()
        if i % K == 0:
            counts.append(n.clone())
        else:
            counts[-1] += n
    return [c.float() for c in counts]


def main():
    cfg = Cfg()
    set_seed(cfg.seed)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.K)

    mcfg = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=32, pad_token_id=0, num_labels=cfg.n_labels,
                       initializer_range=0.1)
    mcfg._attn_implementation = "eager"
    base = LlamaForSequenceClassification(mcfg)
    model = get_peft_model(base, LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8,
                                            lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))

    loader = DataLoader(make_data(cfg), batch_size=cfg.micro_batch, shuffle=False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=cfg.lr, weight_decay=0.0)
    per_rank_batches = len(loader) // accelerator.num_processes
    steps_per_epoch = -(-per_rank_batches // cfg.K)
    total_steps = steps_per_epoch * cfg.epochs
    scheduler = get_scheduler("cosine", optimizer,
                              num_warmup_steps=1 * accelerator.num_processes,
                              num_training_steps=total_steps * accelerator.num_processes)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    W = accelerator.num_processes
    accelerator.print(f"processes: {W}, micro-batches per rank: {len(loader)}, steps: {total_steps}")

    for epoch in range(cfg.epochs):
        counts = window_counts(accelerator, loader, cfg.K)
        model.train()
        for i, (ids, labels) in enumerate(loader):
            with accelerator.accumulate(model):
                logits = model(input_ids=ids).logits
                loss_sum = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
                loss = loss_sum * cfg.K * W / counts[i // cfg.K]
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.clip)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        accelerator.print(f"epoch {epoch}: lr {scheduler.get_last_lr()[0]:.2e}")

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
