"""LoRA SFT on a tiny Llama with the stock HF Trainer: label smoothing, a trained lm_head copy,
an epoch of 8 micro-batches per rank at K = 3 (windows 3-3-2) and a clip that acts.
"""
import hashlib
import os
import random

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

SEED = 1234
VOCAB = 96
PAD_ID = 0


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_examples(n, rng):
    """Prompt/answer pairs of uneven length; the prompt is masked out of the loss."""
    rows = []
    for _ in range(n):
        p_len = rng.randint(3, 9)
        a_len = rng.randint(1, 10)
        prompt = [rng.randint(2, VOCAB - 1) for _ in range(p_len)]
        answer = [rng.randint(2, VOCAB - 1) for _ in range(a_len)]
        ids = prompt + answer
        rows.append({"input_ids": ids, "labels": [-100] * p_len + answer})
    return rows


def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    ids, mask, labels = [], [], []
    for f in features:
        pad = width - len(f["input_ids"])
        ids.append(f["input_ids"] + [PAD_ID] * pad)
        mask.append([1] * len(f["input_ids"]) + [0] * pad)
        labels.append(f["labels"] + [-100] * pad)
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(mask),
        "labels": torch.tensor(labels),
    }


def params_sha256(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def main():
    set_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=PAD_ID, tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM", modules_to_save=["lm_head"])
    model = get_peft_model(base, lora)

    rng = random.Random(SEED)
    train = build_examples(32, rng)

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b_c01_out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        label_smoothing_factor=0.1,
        learning_rate=2e-2,
        optim="adamw_torch",
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=0.3,
        weight_decay=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=SEED,
        data_seed=SEED,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collate)
    trainer.train()
    if trainer.args.process_index == 0:
        print("FINAL_SHA256", params_sha256(trainer.model), flush=True)


if __name__ == "__main__":
    main()
