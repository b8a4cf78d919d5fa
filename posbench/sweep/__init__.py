"""Sweeps: a study file (encodings x tasks x presets x variants x seeds) run as one ``posbench run`` per cell,
on this machine or as SLURM jobs, resumable (``posbench sweep STUDY.toml --out DIR``; docs/sweeps.md).

- ``study``: the TOML file read and checked;
- ``plan``: the study expanded into cells (ids, ``--init`` parents, expected times), each cell's configuration
  resolved before anything runs;
- ``cell``: what runs for one cell, wherever it runs (its folder, its state, its log);
- ``local`` and ``slurm``: the executors;
- ``scheduler``: which cell starts when, and how each one ended;
- ``display``: the plan, the progress bar and the final table.

Nothing here is imported by ``posbench run``; ``cell`` imports no torch, so a cell starts quickly.
"""
