#!/usr/bin/env python3
"""What T5's bias tables learned in finished runs, against the draw they started from (docs/studies/protocols.md,
"T5's two inits by budget"):

    python studies/protocols/t5_tables.py RUN_DIR [RUN_DIR ...]      (a run directory: config.json, checkpoint/)

For each run: the model is rebuilt from its checkpoint's model configuration under the run's seed, as
``posbench run`` builds it (``seed_everything``, then the model), which gives the tables it started from; the
trained tables are the checkpoint's. Both are read as bias in logits (table x scale) by distance, and one
markdown row says, over every layer and head:

- ``init sd``: the standard deviation of the starting bias (the init's noise);
- ``near - far``: the bias at distances 1-4 (their mean) minus the bias of the last bucket (distance
  ``max_distance`` and beyond), at the start and after training: mean and standard deviation over layers x
  heads. A recency profile is a positive mean well above the start's spread;
- ``moved``: how far the entries went, mean and largest |trained - start|, in logits.

A run directory that is not a finished T5 run with a checkpoint is one line on standard error (exit code 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def tables(run: Path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(start, trained, options)``: the bias tables [layers, buckets, heads] in logits, and the encoding's
    recorded options."""
    from safetensors.torch import load_file

    from posbench.model import ModelConfig, Transformer
    from posbench.model.config import current_names
    from posbench.runs.config import RunConfig
    from posbench.train.seeds import seed_everything

    config = json.loads((run / "config.json").read_text())["config"]
    model_config = current_names(json.loads((run / "checkpoint" / "model_config.json").read_text()))
    # a run recorded before an option existed had its earlier value (T5's table_init: x-transformers'), not today's
    recorded = RunConfig.from_dict(config, earlier_values=True).encoding_options
    model_config["encoding_options"] = {**recorded, **model_config.get("encoding_options", {})}
    if model_config.get("encoding") != "t5":
        raise ValueError(f"{run} is a run of '{model_config.get('encoding')}', not t5")
    seed_everything(config["seed"])
    model = Transformer(ModelConfig(**{k: v for k, v in model_config.items()
                                       if k in ModelConfig.__dataclass_fields__}))
    trained = load_file(str(run / "checkpoint" / "model.safetensors"))
    scale = float(trained["encoding.scale"])
    layers = range(len(model.encoding.tables))
    start = torch.stack([model.encoding.tables[i].weight.detach() for i in layers]) * scale
    end = torch.stack([trained[f"encoding.tables.{i}.weight"] for i in layers]) * scale
    return start, end, model.encoding.options


def near_minus_far(bias: torch.Tensor, options: dict) -> torch.Tensor:
    """[layers, heads]: the mean bias of distances 1-4 minus the last bucket's."""
    from posbench.encodings.t5 import causal_bucket

    buckets, max_distance = options["num_buckets"], options["max_distance"]
    near = causal_bucket(torch.arange(1, 5), buckets, max_distance)
    return bias[:, near].mean(1) - bias[:, buckets - 1]


def name(run: Path) -> str:
    """A sweep cell's id (``OUT/cells/<id>/<task>/<encoding>/<run>``), else the run directory's name."""
    resolved = run.resolve()
    inside = len(resolved.parents) > 3 and resolved.parents[3].name == "cells"
    return resolved.parents[2].name if inside else resolved.name


def row(run: Path) -> str:
    start, end, options = tables(run)
    before, after = near_minus_far(start, options), near_minus_far(end, options)
    moved = (end - start).abs()
    return (f"| {name(run)} | {options['table_init']} | {float(options['scale']):.3g} | {start.std():.3f} | "
            f"{before.mean():+.2f} ± {before.std():.2f} | {after.mean():+.2f} ± {after.std():.2f} | "
            f"{moved.mean():.3f} / {moved.max():.3f} |")


HEADER = ("| run | table_init | scale | init sd | near - far at the start | near - far trained | moved: mean / max |\n"
          "|---|---|---:|---:|---:|---:|---:|")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    rows = []
    for given in argv:
        run = Path(given)
        try:
            rows.append(row(run))
        except Exception as exc:                # anything unreadable, of any kind: one line, as the doc says
            print(f"error: {run}: not a finished T5 run with a checkpoint ({exc})", file=sys.stderr)
            return 2
    print("\n".join([HEADER, *rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
