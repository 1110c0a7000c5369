# corpus: style=trainer_class class=F5
# padding positions of the labels set to -100 per micro-batch; the model's loss is the mean
# over this micro-batch's label tokens and each is divided by K: a mean of means
import torch


class SFTRunner:
    def __init__(self, model, tokenizer, accumulation_steps=8):
        self.model = model
        self.tok = tokenizer
        self.accumulation_steps = accumulation_steps
        self.optim = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(self, micro_batches):
        for mb in micro_batches[: self.accumulation_steps]:
            labels = mb["input_ids"].clone()
            labels[mb["input_ids"] == self.tok.pad_token_id] = -100
            loss = self.model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                              labels=labels).loss
            (loss / self.accumulation_steps).backward()  # expect: AG104
        self.optim.step()
        self.optim.zero_grad()
