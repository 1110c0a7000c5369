"""Sentiment head on a bf16 backbone: PEFT LoRA + a fully trained score head, HF Trainer.

The backbone is kept in bf16 (memory); LoRA adapters are upcast to fp32 by PEFT.
"""
import hashlib
import os

import torch
from peft import LoraConfig, TaskType, get_peft_model
from torch.utils.data import Dataset
from transformers import AutoModelForSequenceClassification, LlamaConfig, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))

MODEL_KW = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                num_labels=3, pad_token_id=0)
TRAIN_KW = dict(per_device_train_batch_size=2, gradient_accumulation_steps=8, num_train_epochs=3,
                learning_rate=2e-3, warmup_steps=1, lr_scheduler_type="linear", max_grad_norm=1.0)


class Reviews(Dataset):
    def __init__(self, n, seq_len=24, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(4, MODEL_KW["vocab_size"], (n, seq_len), generator=g)
        lens = torch.randint(8, seq_len + 1, (n,), generator=g)
        self.mask = (torch.arange(seq_len)[None] < lens[:, None]).long()
        self.ids = self.ids * self.mask
        self.labels = (self.ids[:, :4].sum(1) // 7) % 3

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def build_model():
    cfg = LlamaConfig(**MODEL_KW)
    backbone = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.bfloat16)
    lora = LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "o_proj"], modules_to_save=["score"])
    model = get_peft_model(backbone, lora)
    return model


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(99)
    model = build_model()
    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "out_b03"),
        bf16=True,
        weight_decay=0.0,
        seed=99,
        data_seed=99,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
        **TRAIN_KW,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Reviews(192, seed=5))
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"optimizer steps: {trainer.state.global_step}")
        print(f"FINAL_SHA256 {param_sha(trainer.model)}")


if __name__ == "__main__":
    main()
