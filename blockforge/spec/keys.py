"""Every key a recipe or a search file may hold, walked once from the settings' declarations, for every reader of them.

The dataclasses of blockforge/spec/ (recipe.py, model.py with the per-layer fields of fields.py, train.py, data.py,
search.py, tracking.py) say which keys there are, their types, defaults, choices and ranges; `recipe_keys()` and
`search_keys()` walk them into a tree of `Node`s, each with its meaning: its declared help, else the comment on (or just
above) its line in the source, else NOTES. The reference pages (docs/gen_reference.py), the docs' key checks
(tests/test_docs.py) and the JSON Schemas editors validate files with (blockforge/schema.py) all read this tree, so
none of them can name a key the parser does not take, nor miss one it does.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from blockforge.spec.strict import Range, choices_of


# Meanings of keys whose declaration gives none (no help, docstring or comment in the code). Every name here must be a
# key of a tree (the docs build fails otherwise), and a note is refused once the code gives the key a meaning of its own.
NOTES: dict[str, str] = {
    # recipe
    "model.heads": "query heads of every layer (or give head_dim alone: heads = width / head_dim)",
    "model.ffn": "the MLP hidden width of every layer (or ffn_mult)",
    "model.ffn_mult": "the MLP hidden width as a multiple of the width, rounded up to ffn_multiple_of",
    "model.ffn_multiple_of": "FFN widths (from ffn_mult or a ramp) are rounded to a multiple of this",
    "model.norm_eps": "the epsilon of every norm",
    "model.final_norm": "a norm before the output head",
    "model.tie_embeddings": "the output head shares the token embedding's weights",
    "model.attention": "the attention kernel (xformers: CUDA only); every kernel computes the same function",
    "model.rope_theta": "the RoPE base of every layer (a layer may set its own rope_theta)",
    "model.rope_scaling.type": "the scaling kind",
    "model.rope_scaling.factor": "how much long wavelengths are stretched",
    "model.rope_scaling.low_freq_factor": "wavelengths above original_context / low_freq_factor are stretched by factor",
    "model.rope_scaling.high_freq_factor": "wavelengths below original_context / high_freq_factor are kept",
    "model.rope_scaling.original_context": "the context the model was trained at before scaling",
    "model.init_std": "the init std of the blocks' linear weights (times each layer's init_scale)",
    "model.embed_init_std": "the init std of the token embedding",
    "model.layers.pattern[N].offset": "the first layer the entry sets (0-based), below every",
    "model.layers.overrides": "per-layer settings for the layers each entry's `at` selects, applied in order (later ones win)",
    "train": "how a run trains: steps, batch, optimizer, schedule, evaluation, checkpoints, device",
    "train.steps": "optimizer steps of the run (a search's `steps` sets it)",
    "train.lr": "the peak learning rate (times each layer's lr_mult)",
    "train.schedule": "the learning rate after warmup: cosine or linear decay to lr * min_lr_ratio, or constant",
    "train.optimizer": "Adam, or AdamW (decoupled weight decay)",
    "train.weight_decay": "AdamW's weight decay, on matrices only (norms and biases get none; adam ignores it)",
    "train.betas": "Adam's beta1 and beta2",
    "train.eps": "Adam's epsilon",
    "train.seed": "the training seed: data order and initial weights (a search's confirmation varies it)",
    "train.log_every": "steps between the logged training lines in metrics.jsonl",
    "train.device": "where the run trains (auto: CUDA when there is a GPU)",
    "train.compile": "torch.compile the model",
    "train.tensorboard": "also write TensorBoard curves into the run folder (tensorboard/)",
    "train.divergence.max_loss": "the training-loss ceiling after warmup (default: twice the first step's loss)",
    "model.vocab": "the vocabulary size",
    "model.context": "the sequence length in tokens",
    "model.image_size": "the image side in pixels",
    "model.patch_size": "the patch side in pixels",
    "model.channels": "image channels",
    "model.classes": "the number of classes",
    "data": "what a run trains and evaluates on: the source, its tokenizer, and how documents become samples",
    "data.source": "builtin (the Python standard library's documentation), text files, a Hugging Face dataset (llama); "
                   "digits, fashion-mnist, an image folder (vit)",
    "data.text_field": "hf: the dataset's column that holds the text",
    "data.tokenizer": "give bpe (a vocabulary size) or hf (a tokenizer name)",
    "data.num_workers": "data-loader worker processes",
    # search file
    "name": "the search's name: its folder is runs/search-NAME unless --out says otherwise",
    "overrides": "fixed dotted recipe keys set in every trial, e.g. {model.width: 64}",
    "cells": "recipe keys and their values; every combination is a cell, searched on its own",
    "space": "the searched recipe keys, each a distribution: {uniform: [LOW, HIGH]}, {loguniform: ...}, {int: ...}, "
             "{choice: [...]}, {grid: [...]}",
    "baselines": "points tried first in every cell, each setting every searched key",
    "objective": "what the search minimizes or maximizes",
    "objective.metric": "the metric trials report",
    "scheduler": "early stopping in cells too large to enumerate; leave out to train every trial to the full budget",
    "scheduler.asha": "a guarded ASHA per cell",
    "scheduler.asha.grace_steps": "the first rung: no trial is stopped before this step (it must end after the warmup)",
    "scheduler.asha.reduction_factor": "a trial continues past a rung only within the best 1/reduction_factor there",
    "sampler": "how exploration proposes points: tpe, random or grid (give one)",
    "sampler.tpe": "Optuna's TPE sampler",
    "sampler.tpe.seed": "the sampler's seed",
    "sampler.random": "Optuna's random sampler",
    "sampler.random.seed": "the sampler's seed",
    "sampler.grid": "every point of the space in turn (choice and grid dimensions)",
    "divergence": "what a diverged trial is and what it records",
    "resources": "what one trial asks of Ray",
    "resources.cpu": "CPUs per trial",
    "resources.gpu": "GPUs per trial: a fraction below 1, or whole GPUs (more than 1 trains data-parallel inside the trial)",
    "max_concurrent": "trials at once (default: as many as the resources allow); --max-concurrent overrides it",
    "confirm.top": "the best distinct models of exploration confirmed (with a cost axis: up to 2 * top points of the front)",
    "confirm.seeds": "further training seeds each finalist gets",
    "confirm.max_seeds": "racing: further seeds the two leaders and Pre-LN may get until their interval excludes zero",
    "confirm.length.until_stable": "stop once the verdicts at two consecutive lengths agree",
    "transfer.seeds": "paired training seeds per candidate at each target",
    "transfer.neighbours": "k on each side of the predicted one",
    "transfer.resources.cpu": "CPUs per target trial",
    "transfer.resources.gpu": "GPUs per target trial",
    "guide.after": "cells answered before the laws guide the others (at least 2)",
    "guide.margin": "k explored beyond each side of the predicted window",
    "guide.order": "cells run cheapest trial first (cost) or as the file lists them (file)",
    "objectives[N].metric": "a metric the trials report (the first objective is the quality)",
    "objectives[N].cost": "a cost (see the values below)",
    "constraints.NAME.min": "candidates below it are recorded infeasible and never trained",
    "constraints.NAME.max": "candidates above it are recorded infeasible and never trained",
}


@dataclass
class Node:
    """One key of a recipe or search file: a section (a dataclass: `children`), a list of sections (`item`), a mapping
    whose names are free (`names`: "recipe" for dotted recipe keys, "costs", "any"), or a value (a leaf)."""

    key: str
    cls: type | None = None  # the dataclass of a section
    annotation: Any = None
    default: Any = None
    required: bool = False  # no default: the file must give it
    help: str = ""
    choices: tuple = ()
    range: Range | None = None  # the numbers it may hold (strict.bounded)
    children: dict[str, "Node"] = field(default_factory=dict)
    item: "Node | None" = None  # a list of sections: the keys of one (keys name it KEY[N])
    names: str | None = None  # a mapping with free names: what they must be
    values: "Node | None" = None  # such a mapping's values, when they are sections (constraints: bounds)
    list_value: bool = False  # a list of values: KEY[N] names one

    def find(self, parts: list[str]) -> "Node | None":
        """The node a key's parts (after this node's) name, or None when there is none."""
        node = self
        i = 0
        while i < len(parts):
            part = parts[i]
            if part.lstrip("-").isdigit():
                if node.item is not None:
                    node = node.item
                elif not node.list_value:
                    return None
                i += 1
                continue
            if node.names is not None:  # the rest of the key is one name of the mapping
                rest = parts[i:]
                if node.names == "recipe":
                    return node if recipe_keys().find(rest) is not None else None
                if node.names == "costs":
                    return node.values if rest[0] in _costs() and (len(rest) == 1 or node.values.find(rest[1:])) else None
                return node
            child = node.children.get(part)
            if child is None:
                return None
            node = child
            i += 1
        return node


def _parts(key: str) -> list[str]:
    """'model.layers.overrides[0].window' -> ['model', 'layers', 'overrides', '0', 'window']."""
    return [p for p in re.split(r"[.\[\]]+", key) if p]


def _costs() -> dict:
    from blockforge.spec.search import COSTS

    return COSTS


# Mappings whose names are not keys of their own: where a search file names recipe keys or costs.
_FREE_NAMES = {"cells": "recipe", "space": "recipe", "overrides": "recipe", "baselines": "recipe", "to": "recipe",
               "constraints": "costs", "grid": "any"}


def _strip_none(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else typing.Union[tuple(args)]
    return tp


def _section_of(tp: Any) -> type | None:
    """The dataclass a value of annotation `tp` may be (a section, maybe beside a plain value: `str | LayerSettings`)."""
    tp = _strip_none(tp)
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)
    return None


_BUILT: set[str] = set()  # every key the trees hold, as NOTES names them


def _build(cls: type, prefix: str) -> Node:
    node = Node(prefix, cls=cls, help=class_doc(cls))
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        help_text = f.metadata.get("help", "")
        if help_text.startswith("one of "):  # what choice() writes: the values column says it
            help_text = ""
        comment, is_label = comments.get(f.name, ("", False))
        if not is_label:
            help_text = help_text or comment
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        inner = _strip_none(tp)
        section = _section_of(tp)
        if section is not None:
            child = _build(section, key)
        elif typing.get_origin(inner) is list and dataclasses.is_dataclass(typing.get_args(inner)[0]):
            child = Node(key)
            child.item = _build(typing.get_args(inner)[0], f"{key}[N]")
        elif f.name in _FREE_NAMES and (typing.get_origin(inner) is dict or
                                       (typing.get_origin(inner) is list and typing.get_origin(typing.get_args(inner)[0]) is dict)):
            child = Node(key, names=_FREE_NAMES[f.name])
            value_tp = typing.get_args(inner)[1] if typing.get_origin(inner) is dict else None
            if value_tp is not None and dataclasses.is_dataclass(value_tp):
                child.values = _build(value_tp, f"{key}.NAME")
            if typing.get_origin(inner) is list:  # a list of such mappings (baselines, transfer.to)
                child = Node(key, item=Node(f"{key}[N]", names=_FREE_NAMES[f.name]))
        else:
            child = Node(key, list_value=typing.get_origin(inner) in (list, tuple) or (
                typing.get_origin(inner) in (typing.Union, types.UnionType) and any(typing.get_origin(a) in (list, tuple)
                                                                                    for a in typing.get_args(inner))))
        note = NOTES.get(key)
        _BUILT.add(key)
        doc = child.help or (child.item.help if child.item is not None else "")
        if child.cls is not None or (child.item is not None and child.item.cls is not None):  # a section: its docstring first
            text = doc or help_text
        else:
            text = help_text
        if text and note:
            raise ValueError(f"blockforge/spec/keys.py NOTES[{key!r}]: the code gives its meaning ({text!r}); drop the note")
        text = text or note or ""
        if is_label and child.cls is None and child.item is None:
            text = f"{text} ({comment})" if text else comment
        child.annotation, child.help = tp, text
        child.default, child.required = (None, True) if default is dataclasses.MISSING else (default, False)
        child.choices, child.range = choices_of(f) or (), f.metadata.get("range")
        node.children[f.name] = child
    return node


def class_doc(cls: type) -> str:
    """A class's own docstring (not the signature dataclasses writes for a class without one)."""
    doc = cls.__dict__.get("__doc__") or ""
    if not doc or doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(inspect.cleandoc(doc).split())


def field_comments(cls: type) -> dict[str, tuple[str, bool]]:
    """Field name -> (the comment on its line in the class's source, or the comment lines just above it; False), or
    (the comment above an earlier field of its group, with no blank line between; True: a label, not its meaning)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    on_line: dict[int, str] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                on_line[token.start[0]] = token.string.lstrip("#").strip()
    except tokenize.TokenError:
        return {}
    out, above, label = {}, [], ""
    for number, line in enumerate(source.splitlines(), start=1):
        body = line.strip()
        indent = len(line) - len(line.lstrip())
        if not body:
            above, label = [], ""
            continue
        if body.startswith("#") and indent == 4:
            above.append(on_line.get(number, ""))
            continue
        match = re.match(r"    (\w+)\s*:\s*\S", line) if indent == 4 else None
        if match and not body.startswith(("def ", "return ")):
            if on_line.get(number):
                out[match.group(1)] = (on_line[number], False)
            elif above:  # comment lines just above a field: its meaning, and a label of the fields after it
                label = " ".join(above)
                out[match.group(1)] = (label, len(label.split()) <= 3)  # a few words name a group (`# llama`)
            elif label:
                out[match.group(1)] = (label, True)
        if indent <= 4:
            above = []
    return {k: v for k, v in out.items() if v[0]}


_TREES: dict[str, Node] = {}


def recipe_keys() -> Node:
    """Every key a recipe may hold (`base` besides its sections)."""
    if "recipe" not in _TREES:
        from blockforge.spec.recipe import Recipe

        root = _build(Recipe, "")
        root.children["base"] = Node("base", annotation=str | list[str], help="recipe files merged underneath this one, "
                                                                              "relative to it (mappings key by key)", list_value=True)
        _TREES["recipe"] = root
    return _TREES["recipe"]


def search_keys() -> Node:
    """Every key a search file may hold."""
    if "search" not in _TREES:
        from blockforge.spec.search import SearchFile

        _TREES["search"] = _build(SearchFile, "")
    return _TREES["search"]


def known_recipe_key(key: str) -> bool:
    return recipe_keys().find(_parts(key)) is not None


def known_search_key(key: str) -> bool:
    return search_keys().find(_parts(key)) is not None


def unknown_keys(data: Any, node: Node, path: str = "") -> list[str]:
    """The keys of YAML data (a recipe, a search file or a part of one, read at `node`) that the code does not know."""
    bad: list[str] = []
    if node.names is not None:
        if not isinstance(data, dict):
            return bad
        for name, value in data.items():
            where = f"{path}.{name}" if path else str(name)
            if node.names == "recipe" and not known_recipe_key(str(name)):
                bad.append(where)
            elif node.names == "costs":
                if name not in _costs():
                    bad.append(where)
                elif node.values is not None:
                    bad += unknown_keys(value, node.values, where)
        return bad
    if node.item is not None:
        for i, value in enumerate(data if isinstance(data, list) else []):
            bad += unknown_keys(value, node.item, f"{path}[{i}]")
        return bad
    if node.children and isinstance(data, dict):
        for name, value in data.items():
            where = f"{path}.{name}" if path else str(name)
            child = node.children.get(name)
            if child is None:
                bad.append(where)
            else:
                bad += unknown_keys(value, child, where)
        return bad
    if node.choices and isinstance(data, str) and data not in node.choices:
        bad.append(f"{path}: {data}")
    return bad


def check_notes() -> None:
    """Every note names a key the code declares."""
    recipe_keys(), search_keys()
    stale = sorted(set(NOTES) - _BUILT)
    if stale:
        raise ValueError(f"blockforge/spec/keys.py NOTES names keys the code does not declare: {', '.join(stale)}")

