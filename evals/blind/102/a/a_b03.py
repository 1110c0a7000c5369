"""Instruction SFT with the HF Trainer on a tiny Llama (random init), prompt tokens masked
out of the labels, plus FGM adversarial training on the token-embedding output: every
micro-batch gets a clean pass and a pass with the embeddings nudged along their gradient."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

SEED = 11
VOCAB = 96
MAX_LEN = 24
PAD = 0


class PromptCompletionSet(Dataset):
    """Synthetic prompt/completion pairs of varying length; only the completion is supervised."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p_len = int(torch.randint(3, 10, (1,), generator=g))
            c_len = int(torch.randint(2, 13, (1,), generator=g))
            prompt = torch.randint(3, VOCAB, (p_len,), generator=g)
            completion = (prompt[: min(c_len, p_len)].flip(0) + 1) % VOCAB
            completion = torch.cat([completion, torch.randint(3, VOCAB, (c_len - len(completion),), generator=g)])
            ids = torch.cat([torch.tensor([1]), prompt, torch.tensor([2]), completion])
            labels = ids.clone()
            labels[: p_len + 2] = -100
            self.rows.append((ids, labels))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids, labels = self.rows[i]
        return {"input_ids": ids, "labels": labels}


def collate(features):
    n = len(features)
    input_ids = torch.full((n, MAX_LEN), PAD, dtype=torch.long)
    labels = torch.full((n, MAX_LEN), -100, dtype=torch.long)
    attn = torch.zeros((n, MAX_LEN), dtype=torch.long)
    for i, f in enumerate(features):
        L = len(f["input_ids"])
        input_ids[i, :L] = f["input_ids"]
        labels[i, :L] = f["labels"]
        attn[i, :L] = 1
    return {"input_ids": input_ids, "attention_mask": attn, "labels": labels}


class EmbeddingFGM:
    """Records the embedding output on the clean pass, adds a perturbation on the attack pass."""

    def __init__(self, embedding, eps):
        self.eps = eps
        self.mode = "record"
        self.last = None
        self.delta = None
        embedding.register_forward_hook(self._hook)

    def _hook(self, module, args, out):
        if self.mode == "record":
            if out.requires_grad:
                out.retain_grad()
            self.last = out
            return out
        return out + self.delta

    def prepare_attack(self):
        g = self.last.grad.detach()
        self.delta = self.eps * g / (g.norm(dim=-1, keepdim=True) + 1e-12)
        self.mode = "attack"

    def reset(self):
        self.mode, self.last, self.delta = "record", None, None


class FGMTrainer(Trainer):
    def __init__(self, *args, fgm_eps=0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.fgm = EmbeddingFGM(self.model.get_input_embeddings(), fgm_eps)

    def training_step(self, model, inputs, num_items_in_batch=None):
        # clean pass: stock forward/backward (loss over the window's label count)
        loss = super().training_step(model, inputs, num_items_in_batch)
        # adversarial pass on the perturbed embeddings
        self.fgm.prepare_attack()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            adv_loss = self.compute_loss(model, inputs)
        adv_loss = adv_loss / self.args.gradient_accumulation_steps
        self.accelerator.backward(adv_loss)
        self.fgm.reset()
        return loss + adv_loss.detach()


def main():
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "out_b03"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        learning_rate=2e-3,
        lr_scheduler_type="linear",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_steps=1000,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = FGMTrainer(model=model, args=args, train_dataset=PromptCompletionSet(128, SEED),
                         data_collator=collate, fgm_eps=0.5)
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
