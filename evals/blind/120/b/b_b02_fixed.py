"""LoRA fine-tune of a tiny Mistral with Accelerate (no_trainer style script)."""
import argparse, hashlib, math
import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import MistralConfig, MistralForCausalLM, get_scheduler
from peft import LoraConfig, get_peft_model


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per_device_train_batch_size", type=int, default=2)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=3)
    ap.add_argument("--learning_rate", type=float, default=4e-3)
    ap.add_argument("--num_train_epochs", type=int, default=2)
    ap.add_argument("--max_train_steps", type=int, default=None)
    ap.add_argument("--num_warmup_steps", type=int, default=0)
    ap.add_argument("--seed", type=int, default=17)
    return ap.parse_args()


def make_data(n=48, seq=16, vocab=80, seed=3):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randint(0, vocab, (n, seq), generator=g))


def main():
    args = parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    assert accelerator.num_processes == 2
    set_seed(args.seed)
    cfg = MistralConfig(vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=None)
    model = get_peft_model(MistralForCausalLM(cfg), LoraConfig(r=4, lora_alpha=16, lora_dropout=0.0,
                                                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    train_dataloader = DataLoader(make_data(), batch_size=args.per_device_train_batch_size, shuffle=True,
                                  generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate, weight_decay=0.0)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler("linear", optimizer=optimizer,
                                 num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                                 num_training_steps=args.max_train_steps * accelerator.num_processes)

    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)

    for epoch in range(args.num_train_epochs):
        model.train()
        for (ids,) in train_dataloader:
            with accelerator.accumulate(model):
                loss = model(input_ids=ids, labels=ids).loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
