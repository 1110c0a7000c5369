# corpus: style=deepspeed class=OK
# the same checkpoint with the flag read before engine.step(): taken at the boundary
import deepspeed
import torch

GRAD_ACCUM = 4
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": GRAD_ACCUM,
          "gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=config)


def run(engine, data, start, stop_at=None):
    for i in range(start, len(data)):
        loss = torch.nn.functional.mse_loss(engine(data[i][0]), data[i][1])
        boundary = engine.is_gradient_accumulation_boundary()
        engine.backward(loss)
        engine.step()
        if stop_at is not None and boundary and engine.global_steps == stop_at:
            engine.save_checkpoint("ckpt", tag="preempt", client_state={"next": i + 1})
            return i + 1
    return None
