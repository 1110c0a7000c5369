# corpus: style=deepspeed class=F12
# the documented engine loop; the config file it names sums 256 micro-batches in bf16
import deepspeed


def main(net, loader):
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(),
                                           config="ds_config_bf16_zero2_k256.json")  # expect: AG204
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
