"""Stock HF Trainer, LoRA on a tiny Llama with a grown vocabulary, own optimizer/schedule, 3-3-2 windows."""
import hashlib

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

torch.use_deterministic_algorithms(True)
ADDED_TOKENS = 16


class MaskedSFT(Dataset):
    """prompt tokens masked with -100; prompt length varies so label counts differ per micro-batch"""

    def __init__(self, n=32, seq_len=14, vocab=80 + ADDED_TOKENS):
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)
        self.prompt_len = torch.randint(2, 11, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        labels = self.ids[i].clone()
        labels[: self.prompt_len[i]] = -100
        return {"input_ids": self.ids[i], "labels": labels}


def main():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg)
    base.resize_token_embeddings(80 + ADDED_TOKENS)  # new special tokens; stays frozen under LoRA
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
                                            lora_dropout=0.0, init_lora_weights="gaussian"))
    a_params = [p for n, p in model.named_parameters() if p.requires_grad and "lora_A" in n]
    b_params = [p for n, p in model.named_parameters() if p.requires_grad and "lora_B" in n]
    optimizer = torch.optim.AdamW([{"params": a_params, "lr": 1e-3}, {"params": b_params, "lr": 4e-3}],
                                  weight_decay=0.0)
    # 32 samples / (2 per device x 2 ranks) = 8 micro-batches per rank per epoch -> windows 3,3,2 -> 3 updates/epoch
    total_updates = 3 * 2
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - 0.8 * s / total_updates)

    args = TrainingArguments(
        output_dir="tmp_scratch/c01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        max_grad_norm=0.05,  # small enough to act
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        seed=0,
        data_seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=MaskedSFT(), optimizers=(optimizer, scheduler))
    trainer.train()
    if trainer.args.process_index == 0:
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in trainer.model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)


if __name__ == "__main__":
    main()
