"""What every converter shares: account for every tensor it is given, and check the result before handing it over.

A converter reads the source model's parameters and buffers through a `TensorSource`: each is either
taken (mapped into the other model) or left, and anything left at the end is refused by name — a
converter never drops a bias, a norm or a token it does not model. Then `check_same_outputs` runs
both models on one small random input and refuses unless their outputs agree within 1e-4.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

from blockforge.errors import BlockforgeError

TOLERANCE = 1e-4


class ConversionError(BlockforgeError):
    """A model that cannot be converted exactly; the message names what is in the way."""


class TensorSource:
    """The tensors (parameters and buffers, by name) of the model being converted."""

    def __init__(self, model: nn.Module, what: str, *, ignore: Callable[[str], bool] = lambda name: False, into: str = "blockforge's model"):
        self.what = what
        self.into = into  # the model the tensors go into, for messages
        self.tensors = dict(model.named_parameters(remove_duplicate=False))
        self.tensors.update(model.named_buffers(remove_duplicate=False))
        self.left = {name for name in self.tensors if not ignore(name)}

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise ConversionError(f"{self.what} has no tensor '{name}', which {self.into} needs; it is built differently")
        self.left.discard(name)
        return self.tensors[name]

    def copy_into(self, target: torch.Tensor, name: str) -> None:
        """target <- tensor `name`, which must have target's shape."""
        tensor = self.take(name)
        if tensor.shape != target.shape:
            raise ConversionError(
                f"{self.what}'s tensor '{name}' has shape {tuple(tensor.shape)} where {self.into} has {tuple(target.shape)}; "
                "it is built differently (extra tokens, another layout)"
            )
        with torch.no_grad():
            target.copy_(tensor.detach().to(target.dtype))

    def finish(self) -> None:
        """Refuse when any tensor was not mapped."""
        if self.left:
            names = sorted(self.left)
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            raise ConversionError(
                f"{self.what} has tensors {self.into} does not hold ({', '.join(names[:3])}{more}); refusing rather than dropping them"
            )


@torch.no_grad()
def check_same_outputs(
    ours: torch.Tensor, theirs: torch.Tensor, what: str, tolerance: float = TOLERANCE, *,
    cause: str = "so it uses something blockforge does not model",
) -> float:
    """The largest |difference| between two models' outputs on the same input; refused above `tolerance`."""
    if ours.shape != theirs.shape:
        raise ConversionError(f"{what}: the converted model's output has shape {tuple(ours.shape)}, the original's {tuple(theirs.shape)}")
    difference = (ours.float() - theirs.float()).abs().max().item()
    if not difference <= tolerance:
        raise ConversionError(
            f"{what}: the converted model's outputs differ from the original's by {difference:.3g} (more than {tolerance:g}) on a "
            f"random input, {cause}; refused"
        )
    return difference


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' loading and saving without its progress bars and notes (what blockforge checks, it says itself)."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode for the check, back in its own mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def rounded_to(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A float32 copy of `model` with every weight rounded to `dtype` (what an export at `dtype` holds), or `model` itself."""
    if dtype == torch.float32:
        return model
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in (*rounded.parameters(), *rounded.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(dtype).float())
    return rounded



PROBE_LENGTH = 16  # tokens a check runs at least
WINDOW_MARGIN = 16  # ...and past the longest sliding window by this many, so a window in the wrong layer shows


def probe_tokens(spec) -> torch.Tensor:
    """The fixed random token ids a converted language model is checked on against its source: 16 tokens, or
    more than its longest sliding window (up to its context), where a window's place and size change the logits."""
    windows = [layer.window for layer in spec.layers if layer.window is not None]
    length = min(spec.context, max(PROBE_LENGTH, max(windows, default=0) + WINDOW_MARGIN))
    rows = 2 if length <= 256 else 1  # long probes of large models: one row is enough to see a window
    return torch.randint(0, spec.vocab, (rows, length), generator=torch.Generator().manual_seed(0))


# What a converted model keeps of its source, beside its weights in a blockforge folder (blockforge.save writes it):
# source.json (the class, base model, license, precision and token ids of the source config) and, when the source
# had them, generation_config.json (as transformers wrote it) and the tokenizer's files in tokenizer/, verbatim.
SOURCE_FILE = "source.json"
GENERATION_FILE = "generation_config.json"


def read_source(folder: Path) -> dict | None:
    """The source record of a converted model's folder (None for a model blockforge trained)."""
    from blockforge.io import read_json

    path = Path(folder) / SOURCE_FILE
    if not path.is_file():
        return None
    record = read_json(path, "convert the model again")
    from blockforge.errors import CorruptFolderError

    if not isinstance(record, dict) or not isinstance(record.get("model_type"), str):
        raise CorruptFolderError(f"{path}: not a source record (a mapping with model_type); convert the model again")
    if record.get("dtype", "float32") not in DTYPES:
        raise CorruptFolderError(f"{path}: dtype is {record.get('dtype')!r}, none of {', '.join(DTYPES)}; convert the model again, or "
                                 "set it back to the precision the source was stored in")
    return record


DTYPES = ("float32", "bfloat16", "float16")  # the precisions a source record names
# generation_config.json keys blockforge reads, and what each must hold
_GENERATION_KINDS = {"eos_token_id": "ids", "bos_token_id": "ids", "pad_token_id": "ids", "temperature": "number", "top_p": "number",
                     "top_k": "int", "max_new_tokens": "int", "max_length": "int", "do_sample": "bool", "repetition_penalty": "number"}


def check_generation(path: Path, fix: str) -> dict:
    """A generation_config.json, read and checked: a mapping whose token ids, sampling settings and lengths have their
    types; else one sentence naming the file and the key."""
    from blockforge.errors import CorruptFolderError
    from blockforge.io import read_json

    data = read_json(path, fix)
    if not isinstance(data, dict):
        raise CorruptFolderError(f"{path}: holds a {type(data).__name__}, not a mapping of generation settings; {fix}")
    for key, kind in _GENERATION_KINDS.items():
        value = data.get(key)
        if value is None:
            continue
        holds, wanted = _KIND_CHECKS[kind]
        if not holds(value):
            raise CorruptFolderError(f"{path}: {key} is {value!r}, not {wanted}; {fix}")
    return data


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_KIND_CHECKS = {  # kind -> (what holds it, how a message names it)
    "ids": (lambda v: _whole(v) or (isinstance(v, list) and all(_whole(x) for x in v)), "a token id or a list of them"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "int": (_whole, "a whole number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
}


def read_generation(folder: Path) -> dict:
    """The generation settings saved beside a model (generation_config.json's non-default values), {} when none."""
    path = Path(folder) / GENERATION_FILE
    if not path.is_file():
        return {}
    check_generation(path, "convert or export the model again, or correct that key")
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(str(Path(folder)), local_files_only=True)
    except Exception as err:
        from blockforge.errors import CorruptFolderError

        raise CorruptFolderError(f"{path}: cannot be read ({type(err).__name__}); convert the model again or delete it") from None
    settings = config.to_diff_dict()
    settings.pop("transformers_version", None)
    return settings
