# corpus: style=deepspeed class=F14
import deepspeed


def zero_config(n_gpus, micro=4, ga=4):
    return dict(
        train_batch_size=micro * ga * n_gpus,
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=4,
        gradient_clipping=1.0,
        zero_optimization={"stage": 1},
    )


def fit(model, opt, windows, n_gpus):
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=zero_config(n_gpus))
    for window in windows:
        for inputs, labels in window:
            engine.backward(engine(inputs, labels=labels).loss)
        engine.step()  # expect: AG110
