"""The one sentence for a run or sweep too large for the memory: XLA's RESOURCE_EXHAUSTED (at
compile or run time) or numpy's MemoryError, with the size that failed and what to shrink."""

import re

import jax

_BYTES = re.compile(r"(\d+) ?(?:bytes|B)\b")
_UNITS = re.compile(r"(\d+(?:\.\d+)?) ?([KMGT])i?B\b")


def out_of_memory(err: BaseException, expected: str) -> str | None:
    """The sentence for an allocation that failed, with the size it asked for and `expected`
    (what to make smaller); None for any other error."""
    text = str(err).strip()
    lower = text.lower()
    if not isinstance(err, MemoryError) and not (
        "out of memory" in lower or ("resource_exhausted" in lower and "alloc" in lower)
    ):
        return None
    first = text.splitlines()[0].rstrip(".") if text else type(err).__name__
    if (exact := _BYTES.search(text)) is not None:
        size = byte_size(int(exact.group(1)))
    elif (unit := _UNITS.search(text)) is not None:
        size = f"{unit.group(1)} {unit.group(2)}iB"
    else:
        size = None
    where = "on the host" if isinstance(err, MemoryError) else f"on {jax.default_backend()}"
    what = f"allocating {size} failed" if size else "an allocation failed"
    return (
        f"out of memory {where}: {what} ({first[:200]}), expected {expected} (or a device with "
        "more memory)"
    )


def byte_size(n: int) -> str:
    """`n` bytes in the largest binary unit under it, to 3 digits."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"
