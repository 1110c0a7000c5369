# corpus: style=deepspeed class=OK
# the checkpoint saves the index of the next micro-batch to run; the resume starts there
def train(engine, batches, start, stop_at=None, ckpt_dir=None):
    for i in range(start, len(batches)):
        loss = engine(*batches[i])
        engine.backward(loss)
        engine.step()
        if stop_at is not None and engine.global_steps == stop_at:
            engine.save_checkpoint(ckpt_dir, client_state={"position": i + 1})
            return


train(engine, batches, 0, stop_at=5, ckpt_dir="ckpt")
_, state = engine.load_checkpoint("ckpt")
train(engine, batches, start=state["position"])
