"""Memory of an extension fine-tune: measured on small Llamas on a CPU, extrapolated to real sizes.

Nothing of a 7B model can be run on the CPU machine this was built on, so the 7B figure is an **estimate**:

* the static part is exact arithmetic: frozen weights in bfloat16 (2 bytes), trainable parameters in float32
  with their gradient and AdamW's two moments (4 + 4 + 8 bytes);
* the activation part is measured. One forward and backward pass of a scaled-down Llama-2 (the same
  proportions: head_dim 128, intermediate = 2.6875 x hidden, vocabulary = 7.8 x hidden) runs in a fresh process
  per setting, and the peak resident memory above the trained-on state is recorded (glibc is told to return
  every large block to the system, so the resident set follows the live tensors). Peaks at several lengths N
  and two depths L are fitted as ``N x (L x per_layer + per_model)`` (plus an ``N^2`` term, which only eager
  attention has); every per-token term is proportional to the hidden size (and the vocabulary), so the 7B
  slope is ``(4096 / hidden) x (32 x per_layer + per_model)``.

The measurement is in float32; on a GPU the engine autocasts to bfloat16, so the bfloat16 parts of the
activations halve there: the extrapolation is an upper bound. On a CPU, PyTorch's fused SDPA kernel refuses
values wider than keys, so TAPE's state is aggregated in head_dim-wide chunks here (three fused calls); on a
GPU, SDPA's memory-efficient kernel takes the wide values in one call, with the same O(N) memory.

    python -m posbench.hf.memory [--lengths 512,1024,2048] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import LlamaForCausalLM

from posbench.files import atomic_write_json
from posbench.hf.adapter import enable_checkpointing
from posbench.hf.methods import apply_method, make_method
from posbench.hf.rope import llama_of
from posbench.hf.tape_llama import TapeAttention
from posbench.hf.tiny import tiny_config

GiB = 1024 ** 3
LLAMA2_7B = {"hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 32, "intermediate": 11008, "vocab": 32000}
#: the scaled-down Llama-2 that is measured (head_dim 128; intermediate and vocabulary in Llama-2's proportions)
SMALL = {"hidden": 512, "heads": 4, "intermediate": 1376, "vocab": 4000}


# ---- exact arithmetic ----------------------------------------------------------------------------------------

def parameter_counts(shape: dict[str, int], method: str, r: int = 8) -> dict[str, int]:
    """Total and trainable parameters of a Llama of ``shape`` extended by ``method`` (the methods' formulas)."""
    d, layers, h, kvh = shape["hidden"], shape["layers"], shape["heads"], shape["kv_heads"]
    f, v = shape["intermediate"], shape["vocab"]
    dh = d // h
    base = v * d * 2 + layers * (d * h * dh + 2 * d * kvh * dh + h * dh * d + 3 * d * f + 2 * d) + d
    embeddings_norms = v * d + (2 * layers + 1) * d
    if method == "tape":
        i = 4 * h
        per_layer = d * i + 2 * h * i + h * h
        added, trainable = layers * per_layer, (layers - 1) * per_layer + embeddings_norms
    else:
        per_layer = r * (d + h * dh) + 2 * r * (d + kvh * dh) + r * (h * dh + d)
        added, trainable = layers * per_layer, layers * per_layer + embeddings_norms
    return {"base": base, "added": added, "total": base + added, "trainable": trainable}


def static_bytes(shape: dict[str, int], method: str) -> dict[str, float]:
    """Weights (frozen bf16, trainable fp32), gradients and AdamW moments of the trainable parameters."""
    counts = parameter_counts(shape, method)
    frozen = counts["total"] - counts["trainable"]
    return {"frozen_weights_bf16": 2.0 * frozen, "trainable_weights_fp32": 4.0 * counts["trainable"],
            "gradients_fp32": 4.0 * counts["trainable"], "adamw_moments_fp32": 8.0 * counts["trainable"]}


# ---- measuring on a small model (one fresh process per setting) ----------------------------------------------

def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(spec.get("threads", 1))
    torch.manual_seed(0)
    n = spec["length"]
    config = tiny_config(SMALL["vocab"], hidden_size=SMALL["hidden"], layers=spec["layers"], heads=SMALL["heads"],
                         intermediate_size=SMALL["intermediate"], max_positions=n // 2, attention=spec["attention"])
    model = apply_method(LlamaForCausalLM(config), make_method(spec["method"]), 2.0, n)
    TapeAttention.ONE_PASS = ("eager",)       # CPU: head_dim-wide chunks keep SDPA on its fused O(N) kernel
    if spec["checkpointing"]:
        enable_checkpointing(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    x = torch.randint(0, SMALL["vocab"], (1, n))

    def forward_backward():
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), x[0, 1:])
        loss.backward()

    forward_backward()
    optimizer.step()                          # AdamW's moments now exist, as in any later step
    optimizer.zero_grad(set_to_none=True)
    state = getattr(llama_of(model).model.rotary_emb, "_state", None)
    if state is not None:
        state.release()                       # TAPE keeps the last pass's states until the next one starts
    gc.collect()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")                         # reset the peak resident set to the current one
    before = _status()["VmRSS"]
    forward_backward()
    peak = _status()["VmHWM"] - before
    return {**spec, "peak_bytes": peak}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536",
           "MALLOC_ARENA_MAX": "2"}
    proc = subprocess.run([sys.executable, "-m", "posbench.hf.memory", "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {spec} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass
class Fit:
    """peak(N, L) = N x (L x per_layer + per_model) + N^2 x quadratic (bytes)."""

    per_layer: float
    per_model: float
    quadratic: float
    max_relative_error: float


def fit(rows: list[dict[str, Any]], quadratic: bool = False) -> Fit:
    a = np.array([[r["length"] * r["layers"], r["length"]] + ([r["length"] ** 2] if quadratic else [])
                  for r in rows], dtype=float)
    y = np.array([r["peak_bytes"] for r in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    error = float(np.max(np.abs(a @ coef - y) / y))
    return Fit(float(coef[0]), float(coef[1]), float(coef[2]) if quadratic else 0.0, error)


def extrapolate(f: Fit, shape: dict[str, int], length: int) -> float:
    """Activation bytes of ``shape`` at ``length`` tokens from a fit on the small model: every per-token tensor
    is a multiple of hidden, intermediate or vocabulary size (all in Llama-2's proportions), and the N^2 tensors
    of eager attention are per head (heads = hidden / 128 in both), so every term scales with hidden."""
    ratio = shape["hidden"] / SMALL["hidden"]        # heads too scale with hidden (head_dim 128 in both)
    return length * ratio * (shape["layers"] * f.per_layer + f.per_model) + length ** 2 * ratio * f.quadratic


def estimate(fits: dict[str, Fit], shape: dict[str, int] = LLAMA2_7B, length: int = 8192) -> dict[str, Any]:
    """The memory of one micro-batch of ``length`` tokens, per method, from the checkpointed fits."""
    table = {}
    for method in ("lora", "tape"):
        if f"{method}/sdpa/checkpointing" not in fits:
            continue
        static = static_bytes(shape, method)
        activations = extrapolate(fits[f"{method}/sdpa/checkpointing"], shape, length)
        table[method] = {**{k: v / GiB for k, v in static.items()}, "activations_fp32_upper_bound": activations / GiB,
                         "total": (sum(static.values()) + activations) / GiB}
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", default="512,1024,2048")
    parser.add_argument("--out", default=None, help="write the measurements and the estimate as JSON")
    parser.add_argument("--methods", default="lora,tape", help="measure these methods only")
    parser.add_argument("--force", action="store_true", help="replace an existing --out file")
    args = parser.parse_args(argv)
    if args.out and Path(args.out).exists() and not args.force:
        parser.exit(2, f"error: --out {args.out} already exists; pass --force to replace it\n")
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    methods = args.methods.split(",")
    series = [s for s in [("lora", "sdpa", True), ("tape", "sdpa", True), ("lora", "sdpa", False),
                          ("tape", "sdpa", False), ("lora", "eager", True)] if s[0] in methods]
    rows, fits = [], {}
    for method, attention, checkpointing in series:
        group = []
        for layers in (2, 4):
            for n in lengths:
                row = measure({"method": method, "attention": attention, "checkpointing": checkpointing,
                               "layers": layers, "length": n})
                print(f"{method:5s} {attention:5s} checkpointing={checkpointing!s:5s} L={layers} N={n:5d} "
                      f"peak {row['peak_bytes'] / 2**20:8.1f} MiB", flush=True)
                group.append(row)
        key = f"{method}/{attention}/{'checkpointing' if checkpointing else 'no-checkpointing'}"
        fits[key] = fit(group, quadratic=attention == "eager")
        rows += group
        f = fits[key]
        print(f"  fit {key}: {f.per_layer / 1024:.2f} KiB/token/layer + {f.per_model / 1024:.2f} KiB/token"
              f" + {f.quadratic:.1f} B/token^2 (max error {100 * f.max_relative_error:.1f}%)", flush=True)
    table = estimate(fits)
    print("\nESTIMATE, Llama-2-7B, one micro-batch of 8192 tokens, bf16 weights, gradient checkpointing (GiB):")
    for method, parts in table.items():
        print(f"  {method}: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    print("activations alone at 8192 tokens, Llama-2-7B (GiB, fp32 upper bound):")
    for key, f in fits.items():
        print(f"  {key}: {extrapolate(f, LLAMA2_7B, 8192) / GiB:.1f}")
    if args.out:
        atomic_write_json(args.out, {"small_model": SMALL, "measurements": rows,
                                     "fits": {k: vars(v) for k, v in fits.items()}, "estimate_7b_8192": table})


if __name__ == "__main__":
    main()
