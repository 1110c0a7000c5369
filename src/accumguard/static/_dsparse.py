"""Reading a DeepSpeed config file exactly as DeepSpeed 0.19.8 reads it.

DeepSpeed loads a config path with ``hjson.load(..., object_pairs_hook=<refuse
duplicate keys>)``; :func:`parse_config_text` does the same, so it accepts what
DeepSpeed accepts (comments, trailing commas, unquoted keys and values, omitted
root braces) and refuses what DeepSpeed refuses (duplicate keys, at any depth). A
separate iterative scan of the text (:class:`_Scan`) keeps each key's original line
for the findings, names both lines of a duplicate, and refuses — with a clear
error, before hjson's recursive decoder runs — inputs nested too deeply or too large
to be a config. Split from :mod:`accumguard.static.dsconfig` (the checks), which
re-exports everything public here.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hjson

from accumguard.core.errors import ConfigError, LintError

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "UNKNOWN",
    "ConfigDict",
    "ConfigParseError",
    "load_config",
    "parse_config_text",
]


class ConfigParseError(LintError):
    """The config text cannot be read as DeepSpeed reads it (hjson syntax error,
    duplicate key, not an object, nested too deeply, too large).

    ``line``/``col`` are 1-based positions in the original text.
    """

    def __init__(self, message: str, *, path: str | None, line: int, col: int) -> None:
        super().__init__(path or "<config>", line, col, message)


class _Unknown:
    """A value the static analysis cannot know (a config written in a script as
    ``{"train_micro_batch_size_per_gpu": args.bs}``): checks neither validate nor
    use it, but the key counts as present."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"


#: The one :class:`_Unknown` value.
UNKNOWN = _Unknown()


class ConfigDict(dict[str, Any]):
    """A plain ``dict`` that also remembers where it came from.

    ``key_lines`` maps a key path tuple (``("zero_optimization", "stage")``) to
    the 1-based line of that key in the source text, so findings can point at
    it; ``source`` is the file path, if any. ``partial`` is True when the
    config may hold keys we cannot see (a dict literal with ``**base``): checks
    that fire on an *absent* key are then skipped.
    """

    key_lines: dict[tuple[str, ...], int]
    source: str | None
    partial: bool

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        key_lines: dict[tuple[str, ...], int] | None = None,
        source: str | None = None,
        partial: bool = False,
    ) -> None:
        super().__init__(data)
        self.key_lines = key_lines or {}
        self.source = source
        self.partial = partial


# --------------------------------------------------------------------------- parsing

#: Deeper than this is no DeepSpeed config (real ones nest 3-4 levels); hjson's
#: recursive decoder (and so DeepSpeed) fails with RecursionError a few hundred deeper.
MAX_DEPTH = 100
#: Real configs are a few KB; beyond this the file is not a config (and the pure-Python
#: hjson decoder would take seconds).
MAX_BYTES = 1 << 20

_WS = frozenset(" \t\r\n\ufeff")
_LITERAL = re.compile(r"(?:-?\d[\d.eE+\-]*|true|false|null)[ \t]*(?=[,\]}]|#|//|/\*|$)")


class _Scan:
    """One iterative pass over hjson text: key lines, duplicate keys, nesting depth.

    Never recursive (so any depth is safe) and never raises on malformed text: it
    gives up quietly and the hjson decoder reports the syntax error. It follows
    hjson's grammar closely enough to attribute lines; the decoder stays the judge
    of what is valid.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.key_lines: dict[tuple[str, ...], int] = {}
        self.duplicates: list[tuple[tuple[str, ...], int, int]] = []
        self.max_depth = 0
        self.deepest_line = 1
        with contextlib.suppress(IndexError, ValueError):  # malformed: the decoder says where
            self._run()

    def _line(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def _skip(self, i: int) -> int:
        t, n = self.text, len(self.text)
        while i < n:
            c = t[i]
            if c in _WS:
                i += 1
            elif c == "#" or t.startswith("//", i):
                j = t.find("\n", i)
                i = n if j < 0 else j + 1
            elif t.startswith("/*", i):
                j = t.find("*/", i + 2)
                i = n if j < 0 else j + 2
            else:
                break
        return i

    def _string(self, i: int) -> tuple[str, int]:
        """A quoted string at ``i``; return (value, index after it)."""
        t = self.text
        if t.startswith("\'\'\'", i):
            j = t.find("\'\'\'", i + 3)
            j = len(t) if j < 0 else j
            return t[i + 3:j], j + 3
        q = t[i]
        j = i + 1
        out: list[str] = []
        while j < len(t) and t[j] != q:
            if t[j] == "\\":
                j += 1
            if t[j] == "\n":
                raise ValueError("unterminated string")
            out.append(t[j])
            j += 1
        return "".join(out), j + 1

    def _run(self) -> None:
        t, n = self.text, len(self.text)
        # frame: [path, is_object, keys seen {key: line}, current key]
        stack: list[list[Any]] = []
        i = self._skip(0)
        if i < n and t[i] not in "{[":
            stack.append([(), True, {}, None])  # hjson: root braces may be omitted
        while True:
            i = self._skip(i)
            if i >= n:
                return
            c = t[i]
            frame = stack[-1] if stack else None
            if c == ",":
                i += 1
                continue
            if c in "}]":
                if stack:
                    stack.pop()
                i += 1
                continue
            if frame is not None and frame[1] and frame[3] is None:
                # a key: quoted, or every character up to the colon
                if c in "\"'":
                    key, i = self._string(i)
                else:
                    j = i
                    while j < n and t[j] not in ":,{}[]\n":
                        j += 1
                    key, i = t[i:j].strip(), j
                i = self._skip(i)
                if i >= n or t[i] != ":":
                    return
                line = self._line(i)
                key_path: tuple[str, ...] = (*frame[0], key)
                if key in frame[2]:
                    self.duplicates.append((key_path, frame[2][key], line))
                else:
                    frame[2][key] = line
                    self.key_lines.setdefault(key_path, line)
                frame[3] = key
                i += 1
                continue
            # a value
            if c in "{[":
                if frame is None:
                    path: tuple[str, ...] = ()
                elif frame[1]:
                    path = (*frame[0], frame[3])
                else:
                    path = (*frame[0], "[]")
                stack.append([path, c == "{", {}, None])
                if len(stack) > self.max_depth:
                    self.max_depth = len(stack)
                    self.deepest_line = self._line(i)
                i += 1
            elif c in "\"'":
                _, i = self._string(i)
            else:
                eol = t.find("\n", i)
                eol = n if eol < 0 else eol
                m = _LITERAL.match(t, i, eol)
                i = m.end() if m else eol
            if frame is not None and frame[1]:
                frame[3] = None


class _DuplicateKeys(ValueError):
    """Raised from hjson's object hook, like DeepSpeed's dict_raise_error_on_duplicate_keys."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(f"Duplicate keys in DeepSpeed config: {keys}")


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKeys([k for k, _ in pairs if k in seen or seen.add(k)])  # type: ignore[func-returns-value]
    return out


def _too_large(size: int, path: str | None) -> ConfigParseError:
    return ConfigParseError(
        f"the input is {size / 1e6:.1f} MB; a DeepSpeed config is a few KB (limit "
        f"{MAX_BYTES // 1024} KB). Check that this is the config you pass to "
        "deepspeed.initialize(config=...)",
        path=path, line=1, col=1,
    )


def parse_config_text(text: str, *, path: str | None = None) -> ConfigDict:
    """Parse DeepSpeed config text exactly as DeepSpeed does (hjson, duplicate keys refused)
    into a :class:`ConfigDict` whose ``key_lines`` point into the original text.

    Raises :class:`ConfigParseError` with the original line and column when DeepSpeed
    could not read the text, when the top level is not an object, or when the input is
    nested too deeply or too large to be a config.
    """
    if len(text) > MAX_BYTES:
        raise _too_large(len(text), path)
    scan = _Scan(text)
    if scan.max_depth > MAX_DEPTH:
        raise ConfigParseError(
            f"objects/arrays nested {scan.max_depth} levels deep (line {scan.deepest_line}); a "
            f"DeepSpeed config nests a few levels (limit {MAX_DEPTH}) and DeepSpeed's hjson "
            "reader fails with RecursionError on such input. Check that this is the right file",
            path=path, line=scan.deepest_line, col=1,
        )
    try:
        data = hjson.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKeys as exc:
        if scan.duplicates:
            key, first, again = scan.duplicates[0]
            where = ".".join(key)
            raise ConfigParseError(
                f"duplicate key `{where}` (lines {first} and {again}); DeepSpeed refuses the "
                f"config (ValueError: {exc}). Keep one of them",
                path=path, line=again, col=1,
            ) from None
        raise ConfigParseError(f"{exc}; DeepSpeed refuses the config. Keep one of each key",
                               path=path, line=1, col=1) from None
    except hjson.HjsonDecodeError as exc:
        raise ConfigParseError(
            f"not valid hjson/JSON: {exc.msg}. DeepSpeed reads configs with hjson: comments, "
            "trailing commas and unquoted keys are fine, but this is not",
            path=path, line=exc.lineno or 1, col=exc.colno or 1,
        ) from None
    except RecursionError:
        raise ConfigParseError(
            "nested too deeply to read (DeepSpeed's hjson reader fails with RecursionError)",
            path=path, line=scan.deepest_line, col=1,
        ) from None
    except (ValueError, TypeError, IndexError) as exc:  # hjson internals on odd input
        raise ConfigParseError(f"cannot be read as hjson: {exc}", path=path, line=1, col=1) from None
    if not isinstance(data, dict):
        raise ConfigParseError(
            f"the top level is a {type(data).__name__}; a DeepSpeed config is an object "
            '({"train_batch_size": ..., ...})',
            path=path,
            line=1,
            col=1,
        )
    return ConfigDict(data, key_lines=scan.key_lines, source=path)


def load_config(path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> ConfigDict:
    """Load a DeepSpeed config from a file path or take a dict as is.

    A dict passes through (copied into a :class:`ConfigDict` without line
    information), so the engine adapter can call this on whatever the user gave
    ``deepspeed.initialize``. A path is read as UTF-8 and parsed with
    :func:`parse_config_text`. Raises :class:`ConfigParseError` for text DeepSpeed
    cannot read and :class:`~accumguard.core.errors.ConfigError` for a missing file.
    """
    if isinstance(path_or_dict, Mapping):
        if isinstance(path_or_dict, ConfigDict):
            return path_or_dict
        return ConfigDict(path_or_dict)
    path = os.fspath(path_or_dict)
    try:
        p = Path(path)
        if p.is_file() and p.stat().st_size > MAX_BYTES:
            raise _too_large(p.stat().st_size, path)  # before reading it all
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"DeepSpeed config {path!r} does not exist; pass the path of the JSON file you give "
            "deepspeed.initialize(config=...)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read DeepSpeed config {path!r}: {exc}") from None
    return parse_config_text(text, path=path)
