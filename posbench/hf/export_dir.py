"""Where an export is written: a new or empty directory (one that holds files only with ``--force``), filled
as a temporary sibling and renamed into place when complete, so that nothing a user has is overwritten by
accident and a failed export leaves nothing behind."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from posbench.errors import UserError


class ExportError(UserError):
    """A run that cannot be exported, or a directory that is not an export; ``str()`` is one line."""


def check_target(out_dir: Path, force: bool) -> None:
    """``out_dir`` may be written: it does not exist, or is an empty directory, or ``force`` replaces it."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportError(f"{out_dir} already exists and is not a directory; choose a new directory")
    if any(out_dir.iterdir()) and not force:
        raise ExportError(f"{out_dir} already exists and is not empty; export never overwrites: pass --force to "
                          f"replace it, or choose a new directory")


@contextmanager
def building(out_dir: Path, force: bool):
    """A temporary sibling of ``out_dir`` to write the export into; when the block ends it becomes ``out_dir``
    (renamed; an existing ``out_dir`` is replaced only when it is empty or with ``force``), and on any error it
    is removed, leaving ``out_dir`` as it was."""
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        _usual_modes(tmp)
        check_target(out_dir, force)               # it may have appeared (or filled) while exporting
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _usual_modes(directory: Path) -> None:
    """save_pretrained writes its weights 0600; give every file the mode the umask gives a new file."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)
