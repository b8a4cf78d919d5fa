"""Analyses of trained runs: what each attention head attends to (``heads``), run over a run's held-out text
(``analyze``)."""
