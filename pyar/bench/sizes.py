"""Message sizes as people write them ("16M", "16MiB", "4 KB", "1024") and as
tables show them ("16 MiB"); every size is in bytes, powers of 1024."""

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text):
    """Bytes in ``text``: a number with an optional K/M/G/T unit, written
    K, KB or KiB alike (all binary); raises ValueError naming the text."""
    cleaned = str(text).strip().upper().replace(" ", "")
    number = cleaned.removesuffix("B").removesuffix("I")
    unit = number[-1] if number and number[-1] in UNITS else ""
    try:
        value = float(number[:len(number) - len(unit)]) * UNITS[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (write e.g. 4096, 64K, 16M or 1GiB)") from None
    if value < 0 or value != int(value):
        raise ValueError(f"not a whole, non-negative number of bytes: {text!r}")
    return int(value)


def human_bytes(n):
    """``n`` bytes in the largest binary unit that keeps it >= 1."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def doubling(smallest, largest, factor=2):
    """``smallest``, ``smallest * factor``, ... up to ``largest`` (nccl-tests' -f)."""
    if smallest <= 0 or factor < 2:
        raise ValueError(f"need smallest > 0 and factor >= 2, got {smallest} and {factor}")
    size = smallest
    while size <= largest:
        yield size
        size *= factor
