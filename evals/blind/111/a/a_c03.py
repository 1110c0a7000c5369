"""Completion-only SFT with the stock HF Trainer, a grown vocabulary, and a resume.

Ten chat-control tokens are added to a tiny Llama (the embedding and LM head are
resized). The Trainer normalises the token loss over the window's label count
(`num_items_in_batch`); each epoch is 10 micro-batches per rank at K 3, so it ends
with a 1-batch window. A callback simulates a preemption at step 5; the job restarts
in a fresh model and Trainer from `checkpoint-3` and runs to the end.
"""
import hashlib
import os
import shutil

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

BASE_VOCAB, ADDED = 60, 10
SEED = 4242
OUT = os.path.join("tmp_scratch", os.path.basename(__file__)[:-3] + "_out")


class Preempt(TrainerCallback):
    def __init__(self, at):
        self.at = at

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.at:
            control.should_training_stop = True
        return control


class ChatSFT(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            user = torch.randint(3, BASE_VOCAB, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g)
            reply = (user.flip(0) * 3) % BASE_VOCAB
            reply = reply[: int(torch.randint(1, len(reply) + 1, (1,), generator=g))]
            # added tokens: <|user|> = 60, <|assistant|> = 61, <|end|> = 62
            ids = torch.cat([torch.tensor([BASE_VOCAB]), user, torch.tensor([BASE_VOCAB + 1]), reply,
                             torch.tensor([BASE_VOCAB + 2])])
            labels = ids.clone()
            labels[: len(user) + 2] = -100
            self.rows.append((ids, labels))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i][0], "labels": self.rows[i][1]}


def collate(batch):
    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), n, dtype=torch.long)
    lab = torch.full((len(batch), n), -100, dtype=torch.long)
    att = torch.zeros(len(batch), n, dtype=torch.long)
    for i, b in enumerate(batch):
        L = len(b["input_ids"])
        ids[i, :L], lab[i, :L], att[i, :L] = b["input_ids"], b["labels"], 1
    return {"input_ids": ids, "labels": lab, "attention_mask": att}


def build_model():
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=BASE_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg)
    model.resize_token_embeddings(BASE_VOCAB + ADDED, mean_resizing=False)
    return model


def make_args():
    return TrainingArguments(
        output_dir=OUT,
        per_device_train_batch_size=3,
        gradient_accumulation_steps=3,
        num_train_epochs=2,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=0.0,
        seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        save_strategy="steps",
        save_steps=3,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
    )


def main():
    if os.environ.get("RANK", "0") == "0":
        shutil.rmtree(OUT, ignore_errors=True)
    data = ChatSFT(60, seed=12)  # 30 sequences per rank: 10 micro-batches of 3

    args = make_args()
    torch.distributed.barrier()
    first = Trainer(model=build_model(), args=args, train_dataset=data, data_collator=collate,
                    callbacks=[Preempt(at=5)])
    first.train()
    torch.distributed.barrier()

    trainer = Trainer(model=build_model(), args=make_args(), train_dataset=data, data_collator=collate)
    trainer.train(resume_from_checkpoint=os.path.join(OUT, "checkpoint-3"))

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
