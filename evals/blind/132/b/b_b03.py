"""Completion-only SFT of a LoRA adapter with TRL's SFTTrainer.

Pre-tokenised prompt/completion rows; the loss is over completion tokens only.
"""
import argparse
import hashlib
import os

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer

VOCAB = 96


def build_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for i in range(3, VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_dataset(n_rows, seed=7):
    g = torch.Generator().manual_seed(seed)
    rows = {"input_ids": [], "completion_mask": []}
    for _ in range(n_rows):
        p_len = int(torch.randint(3, 9, (1,), generator=g))
        c_len = int(torch.randint(1, 13, (1,), generator=g))
        ids = torch.randint(3, VOCAB, (p_len + c_len,), generator=g).tolist() + [1]
        rows["input_ids"].append(ids)
        rows["completion_mask"].append([0] * p_len + [1] * (c_len + 1))
    return Dataset.from_dict(rows)


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-device-batch", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--sync-token-counts", action="store_true", default=False,
                    help="all-reduce the token count of every accumulation window")
    return ap.parse_args()


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    set_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0, eos_token_id=1, bos_token_id=1,
        )
    )
    config = SFTConfig(
        output_dir="tmp_scratch/b_b03_out",
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        completion_only_loss=True,
        average_tokens_across_devices=args.sync_token_counts,
        use_cpu=True,
        seed=0,
        data_seed=0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        max_length=None,
    )
    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=build_dataset(48),
        processing_class=build_tokenizer(),
        peft_config=peft_config,
    )
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        print("FINAL_SHA256", params_sha256(trainer.model), flush=True)


if __name__ == "__main__":
    main()
