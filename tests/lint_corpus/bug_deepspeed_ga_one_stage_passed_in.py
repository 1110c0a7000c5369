# corpus: style=deepspeed class=F2
# K backwards per engine.step() with gradient_accumulation_steps 1 and the stage from the
# command line: on ZeRO-1/2 every backward is a boundary (warning: right on ZeRO-0/3)
import deepspeed
import torch.nn.functional as F

opts = get_args()
ds_cfg = {
    "train_micro_batch_size_per_gpu": opts.mbs,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": opts.stage},
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_cfg)
for chunk in windows(loader, opts.accum):
    for x, y in chunk:
        loss = F.cross_entropy(engine(x), y) / opts.accum
        engine.backward(loss)
    engine.step()  # expect: AG109
