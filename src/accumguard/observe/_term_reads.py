"""Reading one per-term record (:mod:`._losses_terms`): what a term is over (a mean over the
micro-batch's rows or a whole multiple of them, a masked mean over the valid tokens of the
loss call beside it), which of its constants divide it by K, and the window's own counts.
Pure Python; the rules that compare terms are :mod:`._term_rules`'."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from accumguard.observe._weight_rules import _is

#: the key prefix of a log-prob selection in the ledger's masses: ("select@" + site, order),
#: apart from the loss calls' (site, order)
SELECT_KEY = "select@"


def _sig(x: float) -> int:
    """Significant decimal digits of ``x`` (to 12)."""
    digits = f"{abs(x):.12e}".split("e")[0].replace(".", "").rstrip("0")
    return max(len(digits), 1)


def _row_mean_divisor(c: float, rows: int, k: int) -> bool:
    """``/ c`` is a mean over a whole multiple of the micro-batch's ``rows`` that is no
    multiple of K (``sum / valid_rows`` over two layers' router rows: 2 x rows), so it
    cannot hold a division by K (``/ (rows * K)`` can, and is not taken for one)."""
    return rows > 0 and c >= rows and c % rows == 0 and (c // rows) % k != 0


def _may_hold_k(divs: list[list[Any]], k: int, rows: int = 0) -> bool:
    """A constant that may be a coefficient already divided by K (``0.01 / 4 = 0.0025``:
    times K it has fewer significant digits), or any division (``aux / c`` with ``c`` a
    multiple of K) but a mean's over whole multiples of the rows (:func:`_row_mean_divisor`)."""
    for op, c in divs:
        if str(op) == "/":
            if float(c) % k == 0 and not _row_mean_divisor(float(c), rows, k) \
                    and not (float(c).is_integer() and _positions(int(c), rows)):
                return True
            continue
        if _sig(float(c) * k) < _sig(float(c)):
            return True
    return False


def _mass(w: dict[str, Any], site: str, idx: int) -> float | None:
    """The total weight of one loss call's tokens over the window (1: the large batch's
    mean), from the loss record; None when a micro-step has none."""
    k = int(w.get("window", 0))
    by_micro = {int(r[2]): r for r in w.get("losses") or []
                if str(r[0]) == site and int(r[1]) == idx and not (len(r) > 8 and r[8])}
    if sorted(by_micro) != list(range(k)):
        return None
    return sum(abs(float(r[4])) * float(r[3]) for r in by_micro.values())


def _window_terms(w: dict[str, Any]) -> dict[int, list[list[Any]]] | None:
    """Per micro-step the ``term`` records of a window of K >= 2 in which every backward's
    loss was a sum with the same terms, or None."""
    k = int(w.get("window", 0))
    if k < 2 or int(w.get("zero_grads_between", 0)):
        return None
    by_micro: dict[int, list[list[Any]]] = {}
    for r in w.get("terms") or []:
        if r and r[0] == "term":
            by_micro.setdefault(int(r[1]), []).append(r)
    if sorted(by_micro) != list(range(k)):
        return None
    shapes = {tuple(str(r[3]) for r in sorted(rs, key=lambda r: int(r[2])))
              for rs in by_micro.values()}
    return by_micro if len(shapes) == 1 else None


def windows_with_terms(windows: Iterable[dict[str, Any]]
                       ) -> Iterator[tuple[dict[str, Any], dict[int, list[list[Any]]], int]]:
    """Each window whose every backward's loss was a sum with the same terms
    (:func:`_window_terms`), with those terms per micro-step and its K."""
    for w in windows:
        by_micro = _window_terms(w)
        if by_micro is not None:
            yield w, by_micro, int(w["window"])


def _common(r: list[Any], ref: list[Any]) -> list[list[Any]]:
    """The constants above the sum: the longest common start of the two terms' chains."""
    out = []
    for a, b in zip(r[4], ref[4], strict=False):
        if str(a[0]) != str(b[0]) or not _is(float(a[1]), float(b[1])):
            break
        out.append(a)
    return out


def _own(r: list[Any], ref: list[Any]) -> list[Any]:
    """Term ``r`` with only the constants below the sum (its own)."""
    return [*r[:4], r[4][len(_common(r, ref)):], *r[5:]]


def _k_divisions(divs: list[list[Any]], k: int) -> int:
    """How many constants between a term and the root divide it by exactly ``k``."""
    return sum(1 for op, c in divs if (str(op) == "/" and _is(float(c), float(k)))
               or (str(op) == "*" and _is(float(c), 1.0 / k)))


def _valid_counts(w: dict[str, Any], ref: list[Any], k: int) -> list[int]:
    """Per micro-step the valid tokens of the reference call (0: not recorded)."""
    out = [0] * k
    for r in w.get("losses") or []:
        if str(r[0]) == str(ref[7]) and int(r[1]) == int(ref[8]) and 0 <= int(r[2]) < k \
                and not (len(r) > 8 and r[8]):
            out[int(r[2])] = int(r[3])
    return out


def _count_divisor(r: list[Any], valid: int, k: int) -> float | None:
    """The one division of term ``r`` by exactly the micro-step's ``valid`` tokens of the
    reference call (a masked mean over them: ``(x * mask).sum() / mask.sum()``), or its one
    mean over exactly that many elements (the valid tokens selected, then averaged:
    ``x[mask].mean()``, a z-loss), or None."""
    if r[7] is not None or valid <= 0:
        return None
    if r[5]:
        over = [int(c) for c in r[5]]
        by = [c for op, c in r[4] if str(op) == "/" and float(c) == float(valid)]
        return float(valid) if over == [valid] and not by else None
    hits = [float(c) for op, c in r[4] if str(op) == "/" and float(c) == float(valid)]
    return hits[0] if len(hits) == 1 else None


def _shares_divisor(r: list[Any], ref: list[Any]) -> bool:
    """Term ``r`` is divided by a constant the reference call is divided by too (the
    window's token count all-reduced over ranks: normalised like the main term, whatever
    multiple of the rows that count happens to be)."""
    theirs = [float(c) for op, c in ref[4] if str(op) == "/" and float(c) != 1.0]
    return any(str(op) == "/" and any(_is(float(c), d) for d in theirs) for op, c in r[4])


def _row_mean(r: list[Any], ref: list[Any], k: int) -> bool:
    """A mean over the reference call's rows (or a whole multiple of them), or a recorded
    mean loss call, no constant of which may hold a 1/K."""
    rows = int(ref[9])
    if _may_hold_k(r[4], k, rows):
        return False
    if r[7] is not None:
        return bool(r[10])  # a recorded loss call with reduction 'mean'
    # a mean over the micro-batch's rows, or over a whole multiple of them (an MoE router's
    # probabilities of every layer, concatenated; or a sum divided by that count, as
    # transformers' load-balancing loss does under an attention mask): a per-micro-batch mean
    return _mean_rows(r, rows, k) is not None


def _by_count(r: list[Any], ref: list[Any], k: int, valid: int) -> float | None:
    """The count a term that is no mean over rows (:func:`_row_mean`) is a masked mean
    over: its division by exactly the micro-step's ``valid`` tokens, the other constants
    holding no 1/K; else None."""
    if _row_mean(r, ref, k):
        return None
    count = _count_divisor(r, valid, k)
    if count is None:
        return None
    rest = [d for d in r[4] if not (str(d[0]) == "/" and float(d[1]) == count)]
    return None if _may_hold_k(rest, k, int(ref[9])) else count


def _mean_rows(r: list[Any], rows: int, k: int) -> int | None:
    """The rows term ``r`` is a mean over, when that is a whole multiple of the
    micro-batch's ``rows`` (a mean node's count, or a division by a row count), else None."""
    if rows <= 0:
        return None
    spans = [int(c) for c in r[5]] + [int(float(c)) for op, c in r[4]
                                       if str(op) == "/" and (_row_mean_divisor(float(c), rows, k)
                                                              or (float(c).is_integer()
                                                                  and _positions(int(c), rows)))]
    found = next((c for c in spans if c >= rows and c % rows == 0), None)
    if found is None:
        found = next((c for c in spans if _positions(c, rows)), None)
    if found is None and _made_of_batch_means(r, rows):
        return rows
    if found is None:
        # a mean node over a whole divisor of the rows: the micro-batch's sequences when the
        # loss call beside it took the tokens flattened (rows = sequences x positions)
        found = next((c for c in (int(x) for x in r[5]) if 2 <= c < rows and rows % c == 0),
                     None)
    return found


def _shifted(c: int, rows: int) -> bool:
    """``c`` elements are the micro-batch's tokens before a causal LM loss drops one position
    per sequence: ``rows`` = d x (T - 1) and ``c`` = d x T for d = c - rows sequences of T >= 5
    (a router's probabilities over every input position, beside the shifted LM loss)."""
    d = c - rows
    return d >= 1 and rows % d == 0 and rows // d >= 4


def _positions(c: int, rows: int) -> int:
    """m when ``c`` is m x the micro-batch's positions before the causal shift
    (:func:`_shifted`; m layers' router rows, transformers' MoE loss), else 0."""
    for m in range(1, 17):
        if c % m == 0 and c // m > rows and _shifted(c // m, rows):
            return m
    return 0


def _made_of_batch_means(r: list[Any], rows: int) -> bool:
    """A term from torch ops whose every path down to the parameters goes through a mean
    over the batch dimension of exactly the micro-batch's rows (an MoE load-balancing loss,
    ``n * (probs.mean(0) ** 2).sum()``): a statistic of the micro-batch."""
    below = r[12] if len(r) > 12 else None
    return isinstance(below, list) and bool(below) and all(
        int(c) == rows or _positions(int(c), rows) for c in below)


def window_normalised(w: dict[str, Any], term: list[Any]) -> bool:
    """The recorded loss call a term is (``term[7]``/``term[8]``: its site and order) gave
    every token of the window one weight, in every micro-step, although the micro-steps'
    counts differ: it was normalised over the whole window (a count of the window's tokens),
    not per micro-step, and then not divided by K (no ``/ K`` between it and the root)."""
    recs = [r for r in w.get("losses") or []
            if len(r) > 9 and str(r[0]) == str(term[7]) and int(r[1]) == int(term[8] or 0)
            and not r[8]]
    by_micro = {int(r[2]): r for r in recs}
    k = int(w["window"])
    if sorted(by_micro) != list(range(k)) or len(recs) != k:
        return False
    weights = [abs(float(r[4])) for r in recs]
    counts = {int(r[3]) for r in recs}
    return len(counts) > 1 and max(weights) - min(weights) <= 1e-5 * max(weights) \
        and not any(_k_divisions(r[9], k) for r in recs)
