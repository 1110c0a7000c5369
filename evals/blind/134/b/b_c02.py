"""Stock HF Trainer, masked-prompt SFT on a tiny Llama whose vocabulary was grown for new
special tokens; the input embedding table is frozen, prompts are masked, a DataLoader
worker, a clip that acts, and 7 micro-batches per epoch at K = 3 (windows 3-3-1)."""
import hashlib
import os

import torch
from transformers import (DataCollatorForSeq2Seq, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainingArguments)

SEED, VOCAB, NEW_TOKENS = 5, 60, 4
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                   os.path.splitext(os.path.basename(__file__))[0])


class PadTok:  # the collator only needs a pad id and a padding side
    pad_token_id = 0
    padding_side = "right"

    def pad(self, features, return_tensors="pt", **kw):
        L = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), L, dtype=torch.long)
        att = torch.zeros(len(features), L, dtype=torch.long)
        for i, f in enumerate(features):
            ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
            att[i, : len(f["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": att}


def make_examples(n=28):
    g = torch.Generator().manual_seed(SEED + 11)
    rows = []
    for _ in range(n):
        plen = int(torch.randint(2, 7, (1,), generator=g))
        alen = int(torch.randint(2, 9, (1,), generator=g))
        ids = [VOCAB] + torch.randint(1, VOCAB, (plen,), generator=g).tolist() + [VOCAB + 1] \
            + torch.randint(1, VOCAB, (alen,), generator=g).tolist() + [VOCAB + 2]
        labels = [-100] * (plen + 2) + ids[plen + 2:]
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def main():
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=32,
                                         tie_word_embeddings=False, pad_token_id=0))
    model.resize_token_embeddings(VOCAB + NEW_TOKENS, mean_resizing=False)
    model.get_input_embeddings().weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=2, gradient_accumulation_steps=3,
        num_train_epochs=2, learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=1,
        max_grad_norm=0.3, weight_decay=0.0, seed=SEED, use_cpu=True, ddp_backend="gloo",
        dataloader_num_workers=1, average_tokens_across_devices=True, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True,
    )
    collator = DataCollatorForSeq2Seq(PadTok(), label_pad_token_id=-100)
    trainer = Trainer(model=model, args=args, train_dataset=make_examples(),
                      data_collator=collator)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        torch.save({n: p.detach().float().clone() for n, p in trainer.model.named_parameters()},
                   os.path.join(OUT, "final_params.pt"))
        print(f"steps={trainer.state.global_step}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
