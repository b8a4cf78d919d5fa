"""The command line as a test calls it, in this process: its exit code and what it printed, and its one error line."""

from __future__ import annotations

from posbench.cli import main


def cli(capsys, *argv) -> tuple[int, str, str]:
    """``posbench ARGV...`` (each argument as text): (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    """The one ``error: ...`` line of ``err``, which must hold nothing else."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]
