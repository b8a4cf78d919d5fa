"""posbench: one harness, one results format, every positional encoding implemented exactly."""

__version__ = "0.1.0"
