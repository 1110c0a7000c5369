# corpus: style=alpaca class=OK
# alpaca-like supervised fine-tuning through the HF Trainer: no hand-written loop.
import transformers


def train():
    parser = transformers.HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    data_module = make_supervised_data_module(tokenizer=tokenizer, data_args=data_args)
    trainer = transformers.Trainer(model=model, args=training_args, **data_module)
    trainer.train()
    trainer.save_state()
