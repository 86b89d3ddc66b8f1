"""Figures of the analyses, drawn from their JSON records alone, so `replot(json_path)` redraws any of them.

Matplotlib's object API with the Agg canvas: no pyplot, no global backend state, safe in any process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from blockforge.io import save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure  # imported when a figure is drawn: the command line starts without matplotlib

    return Figure(figsize=(width, height), layout="constrained")


def _state(result: dict) -> str:
    if result["state"] == "init":
        seeds = result["seeds"]
        return f"at init, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    return "trained" + (f", step {result['step']}" if result.get("step") is not None else "")


def _columns(count: int) -> int:
    return min(count, 4)


def plot_grad_norms(record: dict, path: Path) -> None:
    """Mean per-layer gradient norm with a band of one standard deviation, one line per target."""
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    for result in record["results"]:
        mean, std = np.asarray(result["mean"]), np.asarray(result["std"])
        layers = np.arange(len(mean))
        line, = ax.plot(layers, mean, marker="o", markersize=3, label=f"{result['label']} ({_state(result)})")
        ax.fill_between(layers, np.clip(mean - std, mean * 0.05, None), mean + std, color=line.get_color(), alpha=0.2)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("gradient L2 norm over the layer's parameters")
    samples = record["inputs"]
    ax.set_title(f"Gradient norm per layer (mean ± std over {samples['grad_batches']} batches of {samples['batch_size']} per model)")
    ax.legend(fontsize="small")
    save_png(fig, path)


def plot_grad_norms_training(record: dict, path: Path) -> None:
    """Per-layer gradient norms a run logged, one panel per run, one line per logged step (dark: early)."""
    from matplotlib import cm, colors

    results = record["results"]
    cols = _columns(len(results))
    rows = -(-len(results) // cols)
    fig = _figure(4.2 * cols + 0.8, 3.6 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, result in zip(axes.flat, results):
        steps, norms = result["steps"], result["norms"]
        shown = sorted(set(np.linspace(0, len(steps) - 1, min(len(steps), 8)).round().astype(int)))  # at most 8 lines
        scale = colors.Normalize(vmin=steps[0], vmax=steps[-1] if steps[-1] > steps[0] else steps[0] + 1)
        for i in shown:
            ax.plot(norms[i], color=cm.viridis(scale(steps[i])), marker="o", markersize=2, linewidth=1)
        ax.set_yscale("log")
        ax.set_title(result["label"], fontsize="medium")
        ax.set_xlabel("layer")
        fig.colorbar(cm.ScalarMappable(norm=scale, cmap="viridis"), ax=ax, label="training step")
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    axes[0, 0].set_ylabel("gradient L2 norm")
    fig.suptitle("Per-layer gradient norms during training (from metrics.jsonl)")
    save_png(fig, path)


def plot_angular_distance(record: dict, path: Path) -> None:
    """One heatmap per target, each with its own colour scale: x the layer l, y n, colour d(x_l, x_{l+n})."""
    results = record["results"]
    cols = _columns(len(results))
    rows = -(-len(results) // cols)
    fig = _figure(4.6 * cols, 3.8 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, result in zip(axes.flat, results):
        table = np.array(result["distances"], dtype=float)  # null (l + n > L) becomes NaN, drawn blank
        depth = table.shape[0]
        image = ax.imshow(np.ma.masked_invalid(table), origin="lower", cmap="viridis", vmin=0.0,
                          extent=(-0.5, depth - 0.5, 0.5, depth + 0.5), aspect="auto")
        fig.colorbar(image, ax=ax)
        ax.set_title(f"{result['label']}\n{_state(result)}", fontsize="medium")
        ax.set_xlabel("layer $l$")
        ax.set_ylabel("$n$ (layers ahead)")
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    fig.suptitle(f"Angular distance $d(x_l, x_{{l+n}})$ between layer inputs ({results[0]['tokens']:,} tokens per model)")
    save_png(fig, path)


def plot_layer_drop(record: dict, path: Path) -> None:
    """Grouped bars: the change in the validation metric when each layer alone is skipped."""
    results = record["results"]
    fig = _figure(max(7.0, 0.35 * max(len(r["change"]) for r in results) * len(results) + 2), 4.5)
    ax = fig.add_subplot()
    width = 0.8 / len(results)
    for i, result in enumerate(results):
        layers = np.arange(len(result["change"]))
        ax.bar(layers + (i - (len(results) - 1) / 2) * width, result["change"], width,
               label=f"{result['label']} ({result['metric']} {result['baseline']:.4g}, {_state(result)})")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("skipped layer")
    metric = results[0]["metric"]
    ax.set_ylabel(f"change in {metric}")
    ax.set_title(f"Layer-drop: {metric} with one layer skipped, minus the full model's")
    ax.legend(fontsize="small")
    save_png(fig, path)


PLOTS = {
    "grad_norms": plot_grad_norms,
    "grad_norms_training": plot_grad_norms_training,
    "angular_distance": plot_angular_distance,
    "layer_drop": plot_layer_drop,
}


def plot(record: dict, path: str | os.PathLike) -> Path:
    """Draw the figure of an analysis record (what the JSON beside each PNG holds) into `path`."""
    path = Path(path)
    PLOTS[record["analysis"]](record, path)
    return path


def replot(json_path: str | os.PathLike) -> Path:
    """Redraw the PNG beside an analysis JSON file from the JSON alone."""
    json_path = Path(json_path)
    return plot(json.loads(json_path.read_text()), json_path.with_suffix(".png"))
