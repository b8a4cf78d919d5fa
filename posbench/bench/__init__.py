"""``posbench bench``: the speed benchmark, a measurement the runner runs (not a task). Its folder: ``measure.py``
(the cells and their timing), ``speed.py`` (one timed step of each mode), ``measure.toml`` (its presets).
"""

from posbench.bench.measure import Bench

__all__ = ["Bench"]
