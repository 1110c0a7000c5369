"""Accelerate + PEFT LoRA classifier on a tiny Llama backbone under bf16 autocast.
Gradient accumulation through a GradientAccumulationPlugin that syncs every
micro-batch (sync_each_batch), two parameter groups (adapter / score head),
a prepared warm-up schedule and a clip on the sync step."""
import hashlib

import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForSequenceClassification, get_linear_schedule_with_warmup


class Cfg:
    k = 2
    bs = 4
    epochs = 2
    n = 48  # 24 per rank -> 6 micro-batches -> 3 windows per epoch
    seq = 12
    lr_lora = 4e-3
    lr_head = 1e-2
    clip = 0.25
    seed = 3


def data(cfg):
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(1, 96, (cfg.n, cfg.seq), generator=g)
    y = (ids[:, :4].sum(1) % 3)
    return TensorDataset(ids, y)


def main(cfg=Cfg):
    plugin = GradientAccumulationPlugin(num_steps=cfg.k, sync_each_batch=True)
    acc = Accelerator(gradient_accumulation_plugin=plugin, mixed_precision="bf16")
    set_seed(cfg.seed)
    mcfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, num_labels=3, pad_token_id=0)
    model = get_peft_model(
        LlamaForSequenceClassification(mcfg),
        LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj"], lora_dropout=0.0,
                   task_type="SEQ_CLS", init_lora_weights="gaussian"))
    lora = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    head = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    opt = torch.optim.AdamW([{"params": lora, "lr": cfg.lr_lora}, {"params": head, "lr": cfg.lr_head}],
                            weight_decay=0.0)
    loader = DataLoader(data(cfg), batch_size=cfg.bs, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    steps = cfg.epochs * (cfg.n // (cfg.bs * 2)) // cfg.k
    # the prepared scheduler advances once per process on each optimizer step
    sched = get_linear_schedule_with_warmup(opt, 2 * acc.num_processes, steps * acc.num_processes)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)

    model.train()
    for _ in range(cfg.epochs):
        for ids, y in loader:
            with acc.accumulate(model):
                loss = model(input_ids=ids, labels=y).loss
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), cfg.clip)
                opt.step()
                sched.step()
                opt.zero_grad()

    acc.wait_for_everyone()
    if acc.is_main_process:
        net = acc.unwrap_model(model)
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
