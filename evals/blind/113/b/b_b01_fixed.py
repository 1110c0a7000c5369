"""Answer-only SFT of a LoRA adapter with Lightning Fabric (2 CPU ranks).

Each optimizer step sums the answer-token cross-entropy of K micro-batches on
every rank and divides it by the number of answer tokens in the whole window
(all ranks), times the world size to undo DDP's gradient averaging.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
import lightning_fabric as L
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model


@dataclass
class SFTConfig:
    seed: int = 1234
    vocab: int = 96
    n_samples: int = 48
    micro_batch: int = 2
    grad_accum: int = 3
    epochs: int = 2
    lr: float = 0.05
    momentum: float = 0.9
    lora_r: int = 4


class PromptAnswerSet(Dataset):
    def __init__(self, cfg: SFTConfig):
        g = torch.Generator().manual_seed(cfg.seed + 7)
        self.items = []
        for _ in range(cfg.n_samples):
            n_prompt = int(torch.randint(2, 6, (1,), generator=g))
            n_answer = int(torch.randint(1, 11, (1,), generator=g))
            ids = torch.randint(3, cfg.vocab, (n_prompt + n_answer,), generator=g)
            labels = ids.clone()
            labels[:n_prompt] = -100
            self.items.append((ids, labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, (ids, lab) in enumerate(batch):
        input_ids[i, : len(ids)] = ids
        labels[i, : len(ids)] = lab
        mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def build_model(cfg: SFTConfig):
    config = LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(config)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=8, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights="gaussian")
    return get_peft_model(base, lora)


def answer_token_loss(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].float()
    targets = batch["labels"][:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=-100, reduction="sum")


def params_sha256(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = SFTConfig()
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp", precision="32-true")
    fabric.launch()
    fabric.seed_everything(cfg.seed)

    model = build_model(cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=cfg.lr, momentum=cfg.momentum)
    model, optimizer = fabric.setup(model, optimizer)

    loader = DataLoader(PromptAnswerSet(cfg), batch_size=cfg.micro_batch, shuffle=False, collate_fn=collate)
    loader = fabric.setup_dataloaders(loader)
    K = cfg.grad_accum
    windows_per_epoch = len(loader) // K

    step = 0
    for epoch in range(cfg.epochs):
        it = iter(loader)
        for _ in range(windows_per_epoch):
            window = [next(it) for _ in range(K)]
            n_local = sum((b["labels"][:, 1:] != -100).sum() for b in window).float()
            n_window = fabric.all_reduce(n_local, reduce_op="sum")
            for j, batch in enumerate(window):
                with fabric.no_backward_sync(model, enabled=j < K - 1):
                    loss = answer_token_loss(model, batch) * fabric.world_size / n_window
                    fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
        fabric.print(f"epoch {epoch} done, {step} optimizer steps")

    fabric.barrier()
    inner = model.module
    if os.environ.get("PARAM_DUMP") and fabric.global_rank == 0:
        torch.save({n: p.detach().clone() for n, p in inner.named_parameters()}, os.environ["PARAM_DUMP"])
    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {params_sha256(inner)}", flush=True)


if __name__ == "__main__":
    main()
