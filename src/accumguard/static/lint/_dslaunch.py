"""The DeepSpeed configs a launcher beside a script passes it on the command line
(``deepspeed train.py --deepspeed --deepspeed_config ds.json`` in ``run.sh``): lint reads them
for a script that takes ``--deepspeed_config`` and names no config itself
(:meth:`._dsrefs.DsConfigFinder._launcher_config`)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["launcher_configs"]

_LAUNCHERS = ("*.sh", "*.bash", "*.slurm", "*.sbatch", "Makefile")
_MAX_LAUNCHER_BYTES = 200_000
_CONFIG_FLAG = re.compile(r"--deepspeed[_-]config[= ]+['\"]?([^\s'\"]+)")


def launcher_configs(script: Path) -> dict[Path, str]:
    """The configs the launchers beside ``script`` pass it (``--deepspeed_config X`` on a line
    that runs the script), each with where it was read (``run.sh:14``); only files that exist
    beside the script (the launcher is assumed to run from its own folder)."""
    out: dict[Path, str] = {}
    folder = script.parent
    try:
        launchers = sorted({p for pat in _LAUNCHERS for p in folder.glob(pat)})[:20]
    except OSError:
        return out
    for launcher in launchers:
        try:
            if launcher.stat().st_size > _MAX_LAUNCHER_BYTES:
                continue
            lines = launcher.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for no, line in enumerate(lines, 1):
            if not re.search(rf"(^|[\s/]){re.escape(script.name)}(\s|$|[\"'])", line):
                continue
            m = _CONFIG_FLAG.search(line)
            if m is None:
                continue
            cand = folder / m.group(1)
            try:
                if cand.is_file():
                    out.setdefault(cand.resolve(), f"{launcher.name}:{no}")
            except OSError:
                continue
    return out
