"""SFT of a tiny Llama with a LoRA adapter under the HF Trainer.

The Trainer subclass adds label smoothing on the answer tokens only and normalises by
the number of answer tokens in the whole accumulated batch (`num_items_in_batch`).
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class RunConfig:
    vocab: int = 96
    seq_len: int = 24
    n_examples: int = 144          # 72 per rank -> 18 micro-batches of 4 per rank
    micro_bs: int = 4
    grad_accum: int = 3
    epochs: int = 1
    lr: float = 2e-3
    smoothing: float = 0.1
    seed: int = 1234


class PromptAnswerSet(torch.utils.data.Dataset):
    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.rows = []
        for _ in range(cfg.n_examples):
            ids = torch.randint(3, cfg.vocab, (cfg.seq_len,), generator=g)
            prompt_len = int(torch.randint(4, cfg.seq_len - 3, (1,), generator=g))
            labels = ids.clone()
            labels[:prompt_len] = -100
            self.rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class SmoothedSFTTrainer(Trainer):
    """Label-smoothed token loss over the answer tokens of the whole accumulated batch."""

    smoothing = 0.0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        logits = outputs.logits[:, :-1, :].float()
        target = labels[:, 1:]
        tok_loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), target.reshape(-1),
            ignore_index=-100, reduction="sum", label_smoothing=self.smoothing,
        )
        # num_items_in_batch is the all-ranks answer-token count of the window; DDP averages
        # over ranks, so multiply by the world size.
        loss = tok_loss / num_items_in_batch * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss


def main():
    cfg = RunConfig()
    torch.manual_seed(cfg.seed)
    mcfg = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = LlamaForCausalLM(mcfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"],
                      task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)

    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "out_b01"),
        per_device_train_batch_size=cfg.micro_bs,
        gradient_accumulation_steps=cfg.grad_accum,
        num_train_epochs=cfg.epochs,
        learning_rate=cfg.lr,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=100,
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = SmoothedSFTTrainer(model=model, args=args, train_dataset=PromptAnswerSet(cfg))
    trainer.smoothing = cfg.smoothing
    trainer.loss_is_scaled_for_ga = True
    trainer.train()

    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
