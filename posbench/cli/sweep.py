"""``posbench sweep``: run a study file's cells (encodings x tasks x presets x variants x seeds), on this machine
or on SLURM; a rerun skips finished cells and resumes killed ones (docs/sweeps.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from posbench.cli.common import err, out, user_errors
from posbench.cli.setting_flags import given
from posbench.cli.shared_options import DryRun, Out, Quiet
from posbench.files import atomic_write_text
from posbench.sweep.cell import finished_run, is_locked, read_record, unfinished_run
from posbench.sweep.display import SweepDisplay, compare_command, expected_total, outcome_table, plan_table
from posbench.sweep.local import LocalExecutor
from posbench.sweep.plan import expand, validate
from posbench.sweep.scheduler import CELLS_DIR, FINISHED, Sweep
from posbench.sweep.slurm import SlurmExecutor, describe, slurm_options
from posbench.sweep.study import StudyError, read_study

SWEEP_EPILOG = """[bold]Examples[/bold]

  posbench sweep study.toml --dry-run                    (the cells, their expected times, where each stands)

  posbench sweep study.toml --out results/study --jobs 2          (two cells at a time on this machine)

  posbench sweep study.toml --executor slurm --partition gpu --gpus-per-cell 1 --time 120

  posbench sweep study.toml --retry-failed                (also rerun the cells that failed)

[bold]Executor settings[/bold]: each is a flag, and a key of the study file's \\[slurm] table (the flag wins); all but
--gpus-per-cell are --executor slurm's.
"""

EXECUTORS = ("local", "slurm")


def sweep(
    ctx: typer.Context,
    study_file: Path,
    out_dir: Out = None,
    executor: str = typer.Option("local", "--executor", "-x", help="local (this machine) or slurm (one job per "
                                 "cell, through submitit)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="local: cells at a time (default: one per GPU, "
                                       "or 1 on CPUs); the cores are shared out among them."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Also run the cells that failed before "
                                      "(from their checkpoint when they have one)."),
    quiet: Quiet = False,
    dry_run: DryRun = False,
) -> None:
    """Run a study: every cell (task x encoding x preset x variant x seed) is one 'posbench run' with its own
    process, on this machine (--jobs N) or as a SLURM job; a rerun skips finished cells, resumes killed ones, and
    reruns failed ones with --retry-failed. Ends with a table of every cell and the 'posbench compare' command.

    STUDY_FILE: the study file, a .toml (docs/sweeps.md)."""
    with user_errors():
        if executor not in EXECUTORS:
            raise StudyError(f"--executor {executor!r}: choose local or slurm")
        if jobs is not None and jobs < 1:
            raise StudyError(f"--jobs must be >= 1, got {jobs}")
        flags = {setting.key: setting.value for setting in given(ctx)}          # --partition gpu: the executor's
        study = read_study(study_file)
        cells = expand(study)
        validate(cells)
        root = out_dir if out_dir is not None else Path("results") / study.name
        runner = make_executor(executor, study, root, jobs=jobs, given=flags, dry_run=dry_run)
        console = wide_out()
        console.print(plan_table(cells, statuses(cells, root, getattr(runner, "state_of", None))))
        console.print(expected_total(cells))
        console.print(f"{runner if isinstance(runner, str) else runner.describe()}; output in {root}")
        if dry_run:
            return
        code = run_study(study, cells, root, runner, retry_failed=retry_failed, quiet=quiet)
    if code:
        raise typer.Exit(code)


def wide_out():
    """stdout; in a log or a pipe 160 columns wide, so that cell ids and paths stay on one line."""
    console = out()
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


def statuses(cells, root: Path, active=None) -> dict[str, str]:
    """Where each cell stands: complete; running or queued (an earlier sweep's process or SLURM job has it: it is
    followed, not restarted; ``active(cell_dir)`` asks the executor, else a held lock means running); to resume;
    failed; or new."""
    found = {}
    for cell in cells:
        folder = root / CELLS_DIR / cell.id
        state = active(folder) if active is not None else ("running" if is_locked(folder) else None)
        if finished_run(folder) is not None:
            found[cell.id] = "complete"
        elif state:
            found[cell.id] = state
        elif read_record(folder).get("state") == "failed":
            found[cell.id] = "failed"
        elif unfinished_run(folder) is not None:
            found[cell.id] = "resume"
        else:
            found[cell.id] = "new"
    return found


def make_executor(kind: str, study, root: Path, *, jobs, given: dict[str, Any], dry_run: bool = False):
    """The executor, its options checked (``given``: the executor settings from the command line, by key); with
    ``dry_run`` a SLURM executor is only described (no sbatch needed)."""
    if kind == "local":
        slurm_only = [f"--{key.replace('_', '-')}" for key in given if key != "gpus_per_cell"]
        if slurm_only:
            raise StudyError(f"{', '.join(slurm_only)}: options of --executor slurm")
        gpus = slurm_options({}, {"gpus_per_cell": given["gpus_per_cell"]}).gpus_per_cell \
            if "gpus_per_cell" in given else None
        if gpus is not None and gpus < 1:
            raise StudyError(f"--gpus-per-cell must be >= 1 here, got {gpus}")
        return LocalExecutor(jobs, gpus or 1, study.device)
    if jobs is not None:
        raise StudyError("--jobs: an option of --executor local (on SLURM: --max-jobs)")
    options = slurm_options(study.slurm, given)
    return describe(options) if dry_run else SlurmExecutor(root / "slurm", options)


def run_study(study, cells, root: Path, runner, *, retry_failed: bool, quiet: bool) -> int:
    """Run the cells; print the table of every cell and the compare command; the exit code (0: all finished,
    1: a cell failed, was killed or blocked, 130: interrupted)."""
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "study.toml", study.text)
    console = err()
    parallel = runner.capacity if runner.name == "local" else None
    display = SweepDisplay(console, cells, parallel, quiet=quiet)
    job = Sweep(cells, root, runner, display, retry_failed=retry_failed)
    interrupted = False
    try:
        outcomes = job.run()
    except KeyboardInterrupt:
        interrupted, outcomes = True, job.outcomes
    finally:
        display.close()
    console = wide_out()
    console.print(outcome_table(outcomes, root))
    left = runner.still_running([o.handle for o in outcomes.values() if o.state in ("running", "queued")])
    if left:
        console.print(left)
    if any(o.state in FINISHED for o in outcomes.values()):
        console.print(f"compare them: {compare_command(root)}")
    if interrupted:
        err().print("[yellow]interrupted[/yellow]; rerun the same command to go on (finished cells are skipped, "
                    "killed ones resume from their checkpoints)")
        return 130
    bad = [o for o in outcomes.values() if o.state not in FINISHED]
    if bad:
        states = sorted({o.state for o in bad})
        advice = {"killed": "rerun the same command to resume the killed cells",
                  "failed": "--retry-failed reruns the failed ones (see their logs first)",
                  "blocked": "blocked cells start once the cell they start from has finished"}
        err().print(f"{len(bad)} of {len(outcomes)} cells did not finish ({', '.join(states)}): "
                    + "; ".join(advice[s] for s in states if s in advice))
        return 1
    return 0
