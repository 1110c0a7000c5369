"""TRL SFTTrainer on a tiny Qwen2 with a PEFT LoRA adapter, pre-tokenised
prompt/completion data (completion-only loss, ragged lengths) and GA 2 with
2-2-1 windows each epoch."""
import hashlib

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, set_seed
from trl import SFTConfig, SFTTrainer

V = 64


def tiny_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i for i in range(3, V)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def rows(n=20, seed=9):
    g = torch.Generator().manual_seed(seed)
    out = {"input_ids": [], "completion_mask": []}
    for _ in range(n):
        lp, lc = int(torch.randint(2, 6, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g))
        p = torch.randint(3, V, (lp,), generator=g).tolist()
        c = [3 + (p[0] + j) % (V - 3) for j in range(lc)] + [1]
        out["input_ids"].append(p + c)
        out["completion_mask"].append([0] * lp + [1] * len(c))
    return Dataset.from_dict(out)


def main():
    set_seed(2)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = Qwen2ForCausalLM(cfg)
    args = SFTConfig(output_dir="tmp_scratch/c03_out", per_device_train_batch_size=2,
                     gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=5e-3,
                     max_grad_norm=1.0, lr_scheduler_type="constant", save_strategy="no", report_to=[],
                     use_cpu=True, ddp_backend="gloo", seed=2, logging_steps=100, disable_tqdm=True,
                     completion_only_loss=True, max_length=32, padding_free=False, packing=False,
                     bf16=False, dataset_num_proc=None)
    peft_cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                          task_type="CAUSAL_LM", init_lora_weights="gaussian")
    trainer = SFTTrainer(model=model, args=args, train_dataset=rows(), processing_class=tiny_tokenizer(),
                         peft_config=peft_cfg)
    trainer.train()
    if trainer.is_world_process_zero():
        net = trainer.accelerator.unwrap_model(trainer.model)
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
