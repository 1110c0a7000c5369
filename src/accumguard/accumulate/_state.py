"""The checks on a saved Accumulator state before it is loaded.

A resumed run must keep the effective batch: the same K, normalisation and world
size, and counters as :meth:`~accumguard.accumulate.accumulator.Accumulator.state_dict`
wrote them.
"""

from __future__ import annotations

from accumguard.core.errors import ConfigError

STATE_VERSION = 1
STATE_KEYS = ("version", "accumulation_steps", "normalization", "windows_seen",
              "optimizer_steps", "skipped_windows", "micro_batches_consumed")


def check_state(state: object, *, accumulation_steps: int, normalization: str,
                world_size: int) -> None:
    """Raise ConfigError, with the fix, unless ``state`` can be loaded into this run."""
    if not isinstance(state, dict):
        raise ConfigError(
            f"load_state_dict() got a {type(state).__name__}; expected the dict returned by "
            "Accumulator.state_dict(). Pass checkpoint['accumulator'] (whatever key you "
            "saved it under), not the whole checkpoint or a list")
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise ConfigError(
            f"the Accumulator state lacks {missing} (seen keys: {sorted(state)}); expected "
            "the dict returned by Accumulator.state_dict(). Save and load that dict as is")
    bad = [k for k in STATE_KEYS[3:] if isinstance(state[k], bool)
           or not isinstance(state[k], int) or state[k] < 0]
    if bad:
        raise ConfigError(
            f"the Accumulator state has invalid {bad} ({[state[k] for k in bad]}); expected "
            "non-negative ints as written by Accumulator.state_dict()")
    for key, mine in (("accumulation_steps", accumulation_steps),
                      ("normalization", normalization)):
        if state.get(key) != mine:
            raise ConfigError(
                f"checkpoint has {key}={state.get(key)!r} but this Accumulator has {mine!r}; "
                "resuming with a different value changes the effective batch mid-run. "
                "Construct the Accumulator with the checkpoint's value")
    saved_world = state.get("world_size", world_size)
    if saved_world != world_size:
        raise ConfigError(
            f"checkpoint was written by {saved_world} ranks but this run has "
            f"{world_size}; resuming on another world size changes the "
            f"effective batch (K x micro-batch x ranks) mid-run and the data each rank "
            f"reads. Resume on {saved_world} ranks, or start a new run (and scale K so "
            "K x world stays the same) without loading this state")
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"unknown Accumulator state version {state.get('version')!r}; "
                          f"this accumguard writes version {STATE_VERSION}")
