"""Completion-only SFT with TRL + a PEFT LoRA adapter: prompts masked out of the loss,
uneven completion lengths, a DataLoader worker, a clip at 0.3 that acts, and epochs of
7 micro-batches per rank at K = 3 (windows 3-3-1)."""
import hashlib

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer

VOCAB = 70
SEED = 404


def tokenizer():
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def dataset(n):
    g = torch.Generator().manual_seed(SEED)
    rows = []
    for _ in range(n):
        lp = int(torch.randint(3, 10, (1,), generator=g))
        lc = int(torch.randint(1, 9, (1,), generator=g))
        prompt = torch.randint(3, VOCAB, (lp,), generator=g).tolist()
        completion = [3 + (prompt[j % lp] * 2 + j) % (VOCAB - 3) for j in range(lc)] + [2]
        ids = [1] + prompt + completion
        rows.append({"input_ids": ids, "completion_mask": [0] * (1 + lp) + [1] * len(completion)})
    return Dataset.from_list(rows)


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    peft_cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "gate_proj"],
                          task_type="CAUSAL_LM")
    args = SFTConfig(
        output_dir="tmp_scratch/c03_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        learning_rate=5e-3,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=1,
        max_grad_norm=0.3,
        completion_only_loss=True,
        packing=False,
        max_length=32,
        dataloader_num_workers=1,
        seed=SEED,
        data_seed=SEED,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset(28), processing_class=tokenizer(),
                         peft_config=peft_cfg)
    trainer.train()
    if trainer.is_world_process_zero():
        print("steps", trainer.state.global_step,
              "grad norms", [round(h["grad_norm"], 3) for h in trainer.state.log_history if "grad_norm" in h])
        print("FINAL_SHA256", final_sha(trainer.model), flush=True)


if __name__ == "__main__":
    main()
