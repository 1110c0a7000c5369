# corpus: style=hf_custom class=F5
# the collate function pads each batch and masks the padding of the labels with -100, so
# every micro-batch's out.loss is a mean over its own label tokens; the training function
# divides it by K: a mean of means
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained("gpt2")


def collate(examples):
    enc = tok([e["text"] for e in examples], padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}


def train(model, dataset, grad_accum_steps=16, epochs=1):
    loader = DataLoader(dataset, batch_size=4, collate_fn=collate, shuffle=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    step = 0
    for _ in range(epochs):
        for batch in loader:
            out = model(**batch)
            (out.loss / grad_accum_steps).backward()  # expect: AG104
            step += 1
            if step % grad_accum_steps == 0:
                opt.step()
                opt.zero_grad()


if __name__ == "__main__":
    train(AutoModelForCausalLM.from_pretrained("gpt2"), load_dataset())
