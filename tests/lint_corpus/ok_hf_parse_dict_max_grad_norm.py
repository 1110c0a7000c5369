# corpus: style=hf_trainer class=OK
# the clip setting spelled as the TrainingArguments field: no clipping, as meant
from transformers import HfArgumentParser, Trainer, TrainingArguments

SETTINGS = {
    "output_dir": "out",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,
    "max_grad_norm": 0.0,
}
(args,) = HfArgumentParser(TrainingArguments).parse_dict(SETTINGS, allow_extra_keys=True)
Trainer(model=model, args=args, train_dataset=ds).train()
