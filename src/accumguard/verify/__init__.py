"""Verification against the truth: the fp64 single-process reference on the full
effective batch, the audit of a user's loop, the diagnosis that names the bug
class, and the helpers/pytest plugin that put "equivalent to the large batch"
into a team's CI. Nothing here is needed at training time.
"""

__all__: list[str] = []
