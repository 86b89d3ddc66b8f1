"""Layer analysis: per-layer gradient norms, angular distance between layer inputs, layer-drop.

    from blockforge.analysis import grad_norms, angular_distance, layer_drop
    norms = grad_norms(model, batches)              # (batches, layers); .mean(0) is the profile
    table = angular_distance(model, batches).distances  # [n - 1, l] = mean d(x_l, x_{l+n})
    drop = layer_drop(model, batches, "val_loss")   # {'baseline', 'dropped', 'change', ...}

`analyze` runs them over run folders, exports and recipes and writes a figure and its JSON per
measure (the `blockforge analyze` command); `replot` redraws a figure from its JSON.

The names below are imported from their modules when first used (blockforge/lazy.py), so the command line can read
`defaults` without importing torch.
"""

from blockforge.lazy import exports

_WHERE = {
    **dict.fromkeys(("AngularDistance", "SkippedLayer", "angular_distance", "grad_norms", "layer_drop", "layer_skipped",
                     "logged_grad_norms"), "blockforge.analysis.measures"),
    "plot": "blockforge.analysis.plots", "replot": "blockforge.analysis.plots", "analyze": "blockforge.analysis.report",
}

__all__ = [
    "AngularDistance", "SkippedLayer", "analyze", "angular_distance", "grad_norms", "layer_drop", "layer_skipped",
    "logged_grad_norms", "plot", "replot",
]

__getattr__, __dir__ = exports(__name__, _WHERE)
