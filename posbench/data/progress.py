"""Progress for long data work, and the one switch for the libraries' own progress bars.

``library_progress(enabled)`` is what the CLI calls once (``enabled = not --quiet``). It switches, together:

* the progress bars of ``datasets`` (downloads, extraction), ``huggingface_hub`` (file downloads: a 13.5 GB
  model) and ``transformers`` (loading checkpoint shards), for the libraries already imported and, through
  :func:`apply_to`, for those imported later (posbench imports them lazily, and each import site calls
  ``apply_to`` once);
* posbench's own data bars (:class:`DataBar`: tokenising a corpus into the token cache, reading SCROLLS).

Bars are on by default (a library user who never calls ``library_progress`` sees what the libraries show by
default). Warnings of those libraries stay silenced either way: they are the libraries' deprecation notices,
not the user's business.

A :class:`DataBar` shows throughput and ETA. On a terminal it animates (a rich progress bar) until
:meth:`DataBar.detach` is called -- the token cache detaches its bar when training starts, because the engine
then draws its own bar and two live displays on one terminal garble each other -- and from then on, or when
stderr is not a terminal (CI logs, pipes), it prints one plain line every ``every`` seconds and a last line
when it closes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.file_proxy import FileProxy
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_ENABLED = True
#: work shorter than this many seconds closes without a line (a small read needs no report)
QUIET_BELOW = 2.0


def library_progress(enabled: bool) -> None:
    """Show (``True``) or hide (``False``) the download / preprocessing bars of datasets, huggingface_hub and
    transformers, and posbench's own data bars. The CLI calls it with ``not quiet``."""
    global _ENABLED
    _ENABLED = bool(enabled)
    for name in ("datasets", "huggingface_hub", "transformers"):
        module = sys.modules.get(name)
        if module is not None:
            apply_to(module)


@contextlib.contextmanager
def library_bars_off() -> Iterator[None]:
    """Inside: no library or data bars (writing or loading a model's few local shards is not long work:
    ``posbench export`` printed a bar per file); after it, the setting it had."""
    before = _ENABLED
    library_progress(False)
    try:
        yield
    finally:
        library_progress(before)


def progress_enabled() -> bool:
    return _ENABLED


def apply_to(module: Any) -> Any:
    """Apply the current setting to ``datasets``, ``huggingface_hub`` or ``transformers`` (the module itself is
    returned, so ``datasets = apply_to(importlib.import_module("datasets"))`` reads well). Their warnings stay
    at error level."""
    name = getattr(module, "__name__", "")
    try:
        if name == "datasets":
            (module.enable_progress_bars if _ENABLED else module.disable_progress_bars)()
            module.logging.set_verbosity_error()
            import huggingface_hub  # huggingface_hub: datasets loaded it already

            apply_to(huggingface_hub)
        elif name == "huggingface_hub":
            from huggingface_hub import utils  # huggingface_hub: it was given, so it is loaded

            (utils.enable_progress_bars if _ENABLED else utils.disable_progress_bars)()
        elif name == "transformers":
            logging = module.utils.logging
            (logging.enable_progress_bar if _ENABLED else logging.disable_progress_bar)()
            logging.set_verbosity_error()
    except Exception:   # noqa: BLE001 - an old library without these switches: leave it as it is
        pass
    return module


def human(x: float) -> str:
    """1234567 -> '1.23M'."""
    x = float(x)
    for unit in ("", "k", "M", "G", "T"):
        if abs(x) < 1000:
            return f"{x:.3g}{unit}"
        x /= 1000
    return f"{x:.3g}P"


def duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class DataBar:
    """A progress bar for data work: ``update(completed)`` from any thread, ``detach()``, ``close()``.

    ``total`` may be None (unknown). The plain lines read
    ``tokenize c4 train: 4.19M/5.24G tok (0.1%), 812k tok/s, ETA 1:47:20 [5s]``.
    """

    def __init__(self, description: str, total: int | None = None, unit: str = "tok", *, every: float = 30.0,
                 console: Any = None, enabled: bool | None = None, animate: bool | None = None):
        self.description, self.total, self.unit, self.every = description, total, unit, every
        self.enabled = _ENABLED if enabled is None else enabled
        self.start = self._last_line = time.perf_counter()
        self.completed = self._first = 0
        self._lock = threading.Lock()
        self._console = console
        self._progress = None
        self._closed = False
        self._printed = False
        if not self.enabled:
            return
        want_live = self.console.is_terminal if animate is None else animate
        # another rich live display (the engine's training bar) redirects stderr: never draw a second one
        if want_live and not _live_display_active():
            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"),
                                      TimeRemainingColumn(), console=self.console, transient=True)
            self._task = self._progress.add_task(description, total=total, info="")
            self._progress.start()

    @property
    def console(self):
        if self._console is None:
            self._console = Console(stderr=True, highlight=False, soft_wrap=True)
        return self._console

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.start
        return (self.completed - self._first) / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        if self.total is None or rate <= 0:
            return None
        return max(0.0, (self.total - self.completed) / rate)

    def line(self) -> str:
        done = f"{human(self.completed)}/{human(self.total)} {self.unit} ({100 * self.completed / max(self.total, 1):.1f}%)" \
            if self.total else f"{human(self.completed)} {self.unit}"
        elapsed = time.perf_counter() - self.start
        return (f"{self.description}: {done}, {human(self.rate())} {self.unit}/s, ETA {duration(self.eta())} "
                f"[{duration(elapsed)}]")

    def update(self, completed: int, first: bool = False) -> None:
        """Set the amount done; ``first=True`` marks work that was already there (a resumed cache), which the
        throughput leaves out."""
        if not self.enabled or self._closed:
            return
        with self._lock:
            self.completed = int(completed)
            if first:
                self._first = self.completed
                self.start = time.perf_counter()
            if self._progress is not None:
                self._progress.update(self._task, completed=self.completed,
                                      info=f"{human(self.completed)} {self.unit}  {human(self.rate())} {self.unit}/s")
            elif time.perf_counter() - self._last_line >= self.every:
                self._last_line = time.perf_counter()
                self._printed = True
                self.console.print(self.line(), markup=False, highlight=False)

    def detach(self) -> None:
        """Stop animating (someone else draws on the terminal now); keep printing plain lines."""
        with self._lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None
                self._last_line = time.perf_counter()

    def close(self, message: str | None = None) -> None:
        if not self.enabled or self._closed:
            return
        self.detach()
        with self._lock:
            self._closed = True
            if time.perf_counter() - self.start >= QUIET_BELOW or self._printed:
                self.console.print(message or self.line(), markup=False, highlight=False)


def _live_display_active() -> bool:
    return isinstance(sys.stderr, FileProxy) or isinstance(sys.stdout, FileProxy)
