"""One module per ``posbench`` command; ``posbench.cli`` registers them."""
