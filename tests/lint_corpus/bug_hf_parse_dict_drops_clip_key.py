# corpus: style=hf_trainer class=F9
# DeepSpeed's name for the clip in an HF settings dict: parse_dict(allow_extra_keys=True)
# drops it, and the Trainer clips at its default max_grad_norm = 1.0
from transformers import HfArgumentParser, Trainer, TrainingArguments

SETTINGS = {
    "output_dir": "out",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 0.0,  # expect: AG326
}
(args,) = HfArgumentParser(TrainingArguments).parse_dict(SETTINGS, allow_extra_keys=True)
Trainer(model=model, args=args, train_dataset=ds).train()
