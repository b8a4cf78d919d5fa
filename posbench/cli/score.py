"""``posbench score``: score a SCROLLS predictions file ({id: prediction}) against a data set's references,
after validating it like the official verifier (not a JSON object, non-string values, missing ids, extra
ids: each a one-line error, exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from posbench.cli.common import out, user_errors
from posbench.cli.shared_options import Format
from posbench.runs.record import ResultError
from posbench.tasks.scrolls.data import load_split
from posbench.tasks.scrolls.metric import score_predictions_file

SCORE_EPILOG = """[bold]Examples[/bold]

  posbench score predictions.json --dataset qasper --data scrolls_data

  posbench score results/scrolls/rope/RUN/scrolls/quality.json --dataset quality --data DIR --format json
"""


def score(
    predictions: Path,
    dataset: str = typer.Option(..., "--dataset", "-d", help="gov_report, summ_screen_fd, qmsum, narrative_qa, "
                                "qasper, quality or contract_nli."),
    data: Optional[str] = typer.Option(None, "--data", help="DIR with DIR/<dataset>/<split>.jsonl (default: "
                                       "the hub's tau/scrolls, needs a network)."),
    split: str = typer.Option("validation", "--split", help="The split holding the references."),
    fmt: Format = "table",
) -> None:
    """Score a SCROLLS predictions file with the official metric (validated like the official verifier).

    PREDICTIONS: a JSON file {id: prediction}."""
    with user_errors():
        if fmt not in ("table", "json"):
            raise ResultError(f"unknown format '{fmt}'; use table or json")
        examples = load_split(dataset, split, data)
        references = {ex.id: ex.outputs for ex in examples}
        result = score_predictions_file(dataset, predictions, references)
        if fmt == "json":
            out().print(json.dumps(result, indent=2), markup=False)
            return
        table = Table(title=f"SCROLLS {dataset} ({split}, {result['num_predicted']} predictions)",
                      title_justify="left")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in result.items():
            if key in ("display_keys", "display"):
                continue
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
        out().print(table)
