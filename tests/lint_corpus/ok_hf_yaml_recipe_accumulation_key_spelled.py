# corpus: style=hf class=OK
"""A YAML recipe in the script, parsed with yaml.safe_load and handed to
HfArgumentParser.parse_dict(allow_extra_keys=True): its accumulation key is spelled
`gradient_accumulation_steps`, the TrainingArguments field (blind round 125 b_b03 fixed)."""
import yaml
from transformers import HfArgumentParser, Trainer, TrainingArguments

RECIPE = """
output_dir: {out}
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
learning_rate: 0.001
max_grad_norm: 1.0
"""


def main(model, data, out):
    recipe = yaml.safe_load(RECIPE.format(out=out))
    (targs,) = HfArgumentParser(TrainingArguments).parse_dict(recipe, allow_extra_keys=True)
    Trainer(model=model, args=targs, train_dataset=data).train()
