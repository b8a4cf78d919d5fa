"""The order in which the GPU call (run.sh) benches the encodings: what is least known first, then any encoding
registered since the list was written (a plugin included), then the two that run out of memory at the paper's size
last. Prints one comma list for ``posbench bench -e``.

    python benchmarks/gpu/encoding_order.py                      ->  rope,tape,alibi,...,cope,dape
    python benchmarks/gpu/encoding_order.py --only tape,cope,alibi  ->  tape,alibi,cope   (those, in this order)
"""

from __future__ import annotations

from collections.abc import Iterable

FIRST = ("rope", "tape", "alibi", "t5", "fire", "kerple", "sandwich", "xpos", "nope", "randpe", "abacus")
LAST = ("cope", "dape")       # the two that run out of memory at the paper's size (docs/speed.md)


def order(registered: Iterable[str], only: Iterable[str] | None = None) -> list[str]:
    """Every registered encoding once (or those of ``only``): FIRST's in its order, the others sorted, LAST's;
    unregistered names dropped."""
    names = set(registered) if only is None else set(registered) & set(only)
    middle = sorted(names - set(FIRST) - set(LAST))
    return [n for n in FIRST if n in names] + middle + [n for n in LAST if n in names]


if __name__ == "__main__":
    import sys

    from posbench.encodings import ENCODINGS

    only = sys.argv[2].split(",") if sys.argv[1:2] == ["--only"] and len(sys.argv) == 3 else None
    if sys.argv[1:] and only is None:
        sys.exit("usage: encoding_order.py [--only NAME,NAME,...]")
    print(",".join(order(ENCODINGS, only)))
