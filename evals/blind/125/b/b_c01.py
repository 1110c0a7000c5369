"""LoRA SFT with the stock HF Trainer: trained lm_head copy (modules_to_save), a DataLoader worker,
3-3-2 accumulation windows (8 micro-batches per rank per epoch, K = 3) and a clip that acts."""
import hashlib
import os

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

SEED = 21
VOCAB = 72
SEQ = 16


class MaskedSFT(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            p_len = int(torch.randint(2, 6, (1,), generator=g))
            c_len = int(torch.randint(2, SEQ - p_len + 1, (1,), generator=g))
            prompt = torch.randint(2, VOCAB, (p_len,), generator=g)
            comp = torch.flip(prompt, [0]).repeat(c_len)[:c_len]
            ids = torch.zeros(SEQ, dtype=torch.long)
            lab = torch.full((SEQ,), -100, dtype=torch.long)
            att = torch.zeros(SEQ, dtype=torch.long)
            ids[: p_len + c_len] = torch.cat([prompt, comp])
            lab[p_len: p_len + c_len] = comp
            att[: p_len + c_len] = 1
            self.items.append({"input_ids": ids, "attention_mask": att, "labels": lab})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def params_sha(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    set_seed(SEED)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=0, tie_word_embeddings=False))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["lm_head"], task_type="CAUSAL_LM"))

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c01_out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=0.3,
        seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=1,
        save_strategy="no",
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=MaskedSFT(32, SEED))
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"optimizer steps: {trainer.state.global_step}", flush=True)
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
