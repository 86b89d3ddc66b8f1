"""Coordinate check (after microsoft/mup): per-layer activation size and update size over the first Adam
steps, across widths 64..1024 (depth 4) and depths 4..64 (width 64), the standard parametrization against
the transfer one (muP for width, base 64; CompleteP for depth, base 4).

For every size a llama is trained a few steps on one fixed batch at one learning rate
(blockforge.analysis.coordcheck): at each step, the RMS of the embedding output, of each block's output,
of each sub-layer's branch output and of the logits, and the RMS of their change since initialisation.
Flat lines across sizes are the claim of a parametrization that transfers; the standard one's changes
grow with width (Adam moves each coordinate by about the learning rate) and with depth.

    python benchmarks/coord_check.py [--steps 5] [--lr 0.01] [--out runs/coord-check]   # coord_check.json, coord_check.png
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from blockforge.analysis.coordcheck import coord_check
from blockforge.io import pyplot, save_png
from blockforge.spec import ModelSpec, resolve

WIDTHS = [64, 128, 256, 512, 1024]
DEPTHS = [4, 8, 16, 32, 64]
QUANTITIES = ("embedding", "attn", "mlp", "stream", "logits")


def spec(width: int, depth: int, transfer: bool, sweep: str):
    extra = {}
    if transfer:
        extra = dict(parametrization="mup", base_width=64) if sweep == "width" else dict(parametrization="completep", base_depth=4)
    return resolve(ModelSpec(family="llama", width=width, depth=depth, head_dim=32, ffn=4 * width, vocab=256, context=32, **extra))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out", default="runs/coord-check")
    args = parser.parse_args()
    torch.set_num_threads(2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for sweep, sizes in (("width", WIDTHS), ("depth", DEPTHS)):
        for transfer in (False, True):
            name = f"{sweep}/{'transfer' if transfer else 'standard'}"
            rows = []
            for size in sizes:
                width, depth = (size, 4) if sweep == "width" else (64, size)
                records = coord_check(spec(width, depth, transfer, sweep), steps=args.steps, lr=args.lr)
                rows.append({"size": size, "records": [asdict(r) | {"summary": r.summary(), "summary_rms": r.summary("rms")} for r in records]})
                last = records[-1].summary()
                print(f"{name:16s} {sweep} {size:5d}: change after {args.steps} steps " +
                      "  ".join(f"{q} {last[q]:.3g}" for q in QUANTITIES if q in last), flush=True)
            results[name] = rows
    (out / "coord_check.json").write_text(json.dumps({"steps": args.steps, "lr": args.lr, "results": results}, indent=1))
    plot(results, args.steps, out / "coord_check.png")
    for sweep, sizes in (("width", WIDTHS), ("depth", DEPTHS)):
        for kind in ("standard", "transfer"):
            rows = results[f"{sweep}/{kind}"]
            first, last = rows[0]["records"][-1]["summary"], rows[-1]["records"][-1]["summary"]
            print(f"{sweep} {sizes[0]} -> {sizes[-1]}, {kind}: change grows " +
                  ", ".join(f"{q} x{last[q] / first[q]:.2f}" for q in QUANTITIES if q in last and first.get(q)))
    print(f"wrote {out / 'coord_check.json'} and {out / 'coord_check.png'}")


def plot(results: dict, steps: int, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), sharey="row")
    for row, sweep in enumerate(("width", "depth")):
        for col, kind in enumerate(("standard", "transfer")):
            ax = axes[row][col]
            rows = results[f"{sweep}/{kind}"]
            sizes = [r["size"] for r in rows]
            for q, color in zip(QUANTITIES, ("tab:gray", "tab:blue", "tab:green", "tab:orange", "tab:red")):
                for step in range(1, steps + 1):
                    values = [r["records"][step]["summary"].get(q) for r in rows]
                    if None in values:
                        continue
                    ax.plot(sizes, values, "o-" if step == steps else "-", color=color, alpha=0.25 + 0.75 * step / steps,
                            markersize=3, label=q if step == steps else None)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(sweep)
            label = {"width": "muP (base width 64)", "depth": "CompleteP (base depth 4)"}[sweep] if kind == "transfer" else "standard"
            ax.set_title(f"{label}: {sweep} sweep", fontsize=10)
            ax.grid(alpha=0.3, which="both")
            if col == 0:
                ax.set_ylabel(f"RMS change since init (steps 1..{steps})")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("coordinate check: how far the first Adam steps move each activation, by size", fontsize=11)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
