"""Data for posbench: text sources, the built-in corpus, tokenizers and reading at scale (SCROLLS' own files: ``posbench.tasks.scrolls.data``).

Submodules are imported on demand so that importing the package stays cheap:

* ``sources`` (``--data``: built-in, local files, hub names), ``hub`` (which files each hub name reads),
  ``documents`` (a resumable stream of a split's documents), ``splits`` (the held-out check run before training);
* ``tokenizer``, ``corpus``, ``char``;
* ``lm`` (token streams; ``corpus_tokens`` picks memory or the on-disk cache), ``token_cache`` (tokenising into
  a memory-mapped file in the background), ``chunks`` (the training order over a growing cache);
* ``progress`` (``library_progress``, the CLI's ``--quiet`` switch, and the data progress bars),
  ``hub_errors`` (gated / missing / script repositories in one line).
"""

from posbench.data.errors import DataError

__all__ = ["DataError"]
