"""Stock HF Trainer, full fine-tune of a tiny Llama whose vocabulary is grown by 8 tokens,
the first decoder layer frozen, a DataLoader worker, a clip at 0.5 that acts, and epochs of
7 micro-batches per rank at K = 3 (windows 3-3-1), normalised by `num_items_in_batch`.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast, Trainer, TrainingArguments, set_seed)
from tokenizers import Tokenizer, models, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_VOCAB, NEW_TOKENS = 40, 8


def make_tokenizer():
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, BASE_VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                unk_token="<unk>")
    t.add_tokens([f"<tool{i}>" for i in range(NEW_TOKENS)])
    return t


class Sentences(Dataset):
    def __init__(self, tok, n=28, seed=21):
        g = torch.Generator().manual_seed(seed)
        self.enc = []
        for _ in range(n):
            L = int(torch.randint(3, 14, (1,), generator=g))
            words = [f"w{int(w)}" if w < BASE_VOCAB else f"<tool{int(w) - BASE_VOCAB}>"
                     for w in torch.randint(4, BASE_VOCAB + NEW_TOKENS, (L,), generator=g)]
            self.enc.append(tok(" ".join(words))["input_ids"])

    def __len__(self):
        return len(self.enc)

    def __getitem__(self, i):
        return {"input_ids": self.enc[i]}


def main():
    set_seed(0)
    tok = make_tokenizer()
    cfg = LlamaConfig(vocab_size=BASE_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.resize_token_embeddings(len(tok))
    for p in model.model.layers[0].parameters():
        p.requires_grad_(False)

    args = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "c03_out"), per_device_train_batch_size=2,
        gradient_accumulation_steps=3, num_train_epochs=2, learning_rate=3e-3, lr_scheduler_type="linear",
        warmup_steps=2, max_grad_norm=0.5, save_strategy="no", logging_steps=100, report_to=[], seed=0,
        data_seed=0, use_cpu=True, ddp_backend="gloo", disable_tqdm=True, dataloader_num_workers=1,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Sentences(tok),
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
