"""Data for posbench: text sources, the built-in corpus, tokenizers and SCROLLS files.

Submodules are imported on demand (``posbench.data.sources``, ``.corpus``, ``.tokenizer``,
``.scrolls_data``) so that importing the package stays cheap.
"""

from posbench.data.errors import DataError

__all__ = ["DataError"]
