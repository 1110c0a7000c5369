# corpus: style=hf class=F5
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class SpeechPrefixLM(LlamaForCausalLM):
    accepts_loss_kwargs = False  # expect: AG378

    def forward(self, input_ids=None, labels=None, audio=None, **kwargs):
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


def main(train_ds, collate):
    model = SpeechPrefixLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64))
    args = TrainingArguments("out", per_device_train_batch_size=4, gradient_accumulation_steps=8,
                             report_to=[])
    Trainer(model=model, args=args, train_dataset=train_ds, data_collator=collate).train()


def other(train_ds):
    # a stock class: it honours num_items_in_batch
    lm = GPT2LMHeadModel(GPT2Config(n_layer=2))
    args = TrainingArguments("out2", per_device_train_batch_size=4, gradient_accumulation_steps=8,
                             report_to=[])
    Trainer(model=lm, args=args, train_dataset=train_ds).train()
