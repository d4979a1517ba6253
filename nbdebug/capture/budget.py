"""One memory policy: ``--max-bytes`` bounds what every view keeps beyond scalar stats.

>>> parse_bytes("64MB"), parse_bytes("1.5 GB"), parse_bytes(4096), parse_bytes("2e6")
(67108864, 1610612736, 4096, 2000000)
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_MAX_BYTES", "Budget", "format_bytes", "parse_bytes"]

#: the budget when the user sets none (``%config NNDebugMagics.max_bytes`` changes it in the magic)
DEFAULT_MAX_BYTES = 256 * 2**20

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(value: int | float | str | None, default: int = DEFAULT_MAX_BYTES) -> int:
    """A byte count from ``64MB``, ``512 KiB``, ``1.5GB``, ``4096`` (units are powers of 2: MB = 2^20).

    ``None`` gives ``default``; ``0`` is honoured (keep nothing beyond scalar stats). Raises
    ``ValueError`` naming the accepted forms.
    """
    if value is None:
        return int(default)
    if isinstance(value, bool):
        raise ValueError(f"max bytes: {value!r} is not a size")
    if isinstance(value, (int, float)):
        n = value
    else:
        m = _RE.match(str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"max bytes: {value!r} is not a size; write e.g. 64MB, 512KB, 1.5GB or a number of bytes")
        n = float(m.group(1)) * _UNITS[unit]
    if n < 0:
        raise ValueError(f"max bytes: {value!r} is negative")
    return int(n)


def format_bytes(n: int | float) -> str:
    """``67108864`` → ``'64 MB'`` (binary units, as :func:`parse_bytes` reads them)."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


class Budget:
    """What one capture keeps beyond scalar stats, against ``max_bytes``: ``kept`` bytes so far,
    ``dropped`` (what did not fit), ``exceeded`` (something did not fit)."""

    __slots__ = ("dropped", "exceeded", "kept", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.kept = 0
        self.dropped = 0
        self.exceeded = False

    def keep(self, nbytes: int) -> bool:
        """Count ``nbytes`` as kept when they fit (True); else count them as dropped (False)."""
        if self.kept + nbytes > self.max_bytes:
            self.exceeded = True
            self.dropped += nbytes
            return False
        self.kept += nbytes
        return True

    @property
    def left(self) -> int:
        """Bytes still free (never negative)."""
        return max(0, self.max_bytes - self.kept)

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` kept by a copy that sized itself to :attr:`left` (incident copies)."""
        self.kept += nbytes

    def note(self) -> str | None:
        """The result's note when something did not fit, else None."""
        if not self.exceeded:
            return None
        return (f"byte budget of {format_bytes(self.max_bytes)} reached: kept {format_bytes(self.kept)} of samples/histograms, "
                f"dropped {format_bytes(self.dropped)} for later layers (stats are kept for every layer; raise max_bytes to keep them)")
