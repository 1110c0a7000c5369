# corpus: style=hf_trainer class=F6
# The flag is kept in a module constant handed to the arguments.
from transformers import Trainer, TrainingArguments

AVG_TOKENS = False


def main(model, ds):
    args = TrainingArguments(output_dir="/tmp/out", per_device_train_batch_size=4,
                             gradient_accumulation_steps=4, max_steps=10,
                             average_tokens_across_devices=AVG_TOKENS)  # expect: AG140
    Trainer(model=model, args=args, train_dataset=ds).train()
