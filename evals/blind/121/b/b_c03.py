"""Answer-only SFT of a tiny Llama with PEFT LoRA through the stock HF Trainer.

Prompt tokens carry label -100, so the label counts differ per micro-batch; the model's own loss is
normalised by the Trainer's all-ranks `num_items_in_batch`. Activation checkpointing, one DataLoader
worker, 10 examples per rank at batch 2: windows of 2-2-1 at K = 2, clip 0.5.
"""
import hashlib
import os

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, SEQ = 80, 20


class QA(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, VOCAB, (n, SEQ), generator=g)
        self.prompt_len = torch.randint(4, 15, (n,), generator=g)
        self.total_len = torch.clamp(self.prompt_len + torch.randint(2, 8, (n,), generator=g), max=SEQ)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i].clone()
        pos = torch.arange(SEQ)
        attn = (pos < self.total_len[i]).long()
        ids[attn == 0] = 0
        labels = ids.clone()
        labels[(pos < self.prompt_len[i]) | (attn == 0)] = -100
        return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(21)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, pad_token_id=0))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                                            target_modules=["q_proj", "k_proj", "v_proj", "gate_proj"]))
    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "out_c03"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=4,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=0.5,
        weight_decay=0.0,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        dataloader_num_workers=1,
        seed=21,
        data_seed=21,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=QA(20, seed=4))
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"optimizer steps: {trainer.state.global_step}")
        print(f"FINAL_SHA256 {param_sha(trainer.model)}")


if __name__ == "__main__":
    main()
