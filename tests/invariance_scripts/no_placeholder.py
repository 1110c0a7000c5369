"""A script that takes no accumulation setting at all: `accumguard invariance` must refuse it
(every K would run the same training)."""

print("training with a fixed batch")
