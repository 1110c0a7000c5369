"""Masked SFT of a tiny Llama with the HF Trainer (2 ranks, GA 4).

The loss is a token-level cross-entropy over the prompt-masked completion
tokens, normalised by the number of completion tokens in the whole
accumulated batch (`num_items_in_batch`), as the HF docs recommend.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed


@dataclass
class RunConfig:
    seq_len: int = 24
    vocab: int = 96
    n_samples: int = 64
    per_device_bs: int = 2
    grad_accum: int = 4
    lr: float = 0.05
    epochs: int = 2
    seed: int = 1234
    out_dir: str = "tmp_scratch/b01_out"


class MaskedSFT(Dataset):
    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.ids = torch.randint(3, cfg.vocab, (cfg.n_samples, cfg.seq_len), generator=g)
        self.prompt_len = torch.randint(4, cfg.seq_len - 3, (cfg.n_samples,), generator=g)

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: self.prompt_len[i]] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def completion_loss(outputs, labels, num_items_in_batch=None):
    """Sum of token losses over the accumulated batch's completion-token count.

    The count covers every rank (Trainer gathers it), so the per-rank sum is
    scaled back up by the number of ranks (the Trainer does that itself).
    """
    logits = outputs.logits[:, :-1, :].float()
    tgt = labels[:, 1:].to(logits.device)
    tok_loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                               ignore_index=-100, reduction="sum")
    return tok_loss / num_items_in_batch


def param_sha(model) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    mcfg = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(mcfg)
    args = TrainingArguments(
        output_dir=cfg.out_dir, per_device_train_batch_size=cfg.per_device_bs,
        gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.lr, num_train_epochs=cfg.epochs,
        optim="sgd", lr_scheduler_type="linear", warmup_steps=1, max_grad_norm=0.0, weight_decay=0.0,
        seed=cfg.seed, data_seed=cfg.seed, use_cpu=True, ddp_backend="gloo", report_to=[],
        save_strategy="no", logging_steps=100, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=MaskedSFT(cfg), compute_loss_func=completion_loss)
    assert trainer.accelerator.num_processes == 2
    trainer.train()
    if trainer.accelerator.is_main_process:
        print(f"FINAL_SHA256 {param_sha(trainer.model)}", flush=True)
        torch.save({n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                   os.path.join("tmp_scratch", os.path.basename(__file__).replace(".py", ".pt")))


if __name__ == "__main__":
    main()
