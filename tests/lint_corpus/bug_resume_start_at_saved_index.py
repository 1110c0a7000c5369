# corpus: style=deepspeed class=F13
# the checkpoint saves the index of the micro-batch just trained; the resume starts there,
# so that micro-batch is trained twice and every later window shifts by one
def train(engine, batches, start, stop_at=None, ckpt_dir=None):
    for i in range(start, len(batches)):
        loss = engine(*batches[i])
        engine.backward(loss)
        engine.step()
        if stop_at is not None and engine.global_steps == stop_at:
            engine.save_checkpoint(ckpt_dir, client_state={"position": i})
            return


train(engine, batches, 0, stop_at=5, ckpt_dir="ckpt")
_, state = engine.load_checkpoint("ckpt")
train(engine, batches, start=state["position"])  # expect: AG327
