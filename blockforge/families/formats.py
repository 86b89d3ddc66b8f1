"""What the export formats of other libraries share (`blockforge export --format hf|timm`).

A family offers a format with an `ExportFormat` in its registration (`Family.exports`). blockforge.export
writes the native export first, then hands the loaded model and that folder to `write`. A format writes
into a staging folder inside the destination, loads what it wrote with the other library, compares the
outputs with blockforge's, and only then moves the files into place, so a refused export leaves no
half-written model behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

from blockforge.spec.model import ResolvedSpec

RECORDS = ("recipe.yaml", "data.json", "metrics.json", "source.json")  # the native export's records, kept beside the converted model
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,  # --dtype, and precisions by torch's names
          "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ExportFormat:
    name: str  # the --format value
    library: str  # for messages: "transformers", "timm"
    check: Callable[[ResolvedSpec], None]  # refuses a spec the format cannot hold, before anything is written
    usage: Callable[[ResolvedSpec, Path], str]  # usage(spec, native export folder): the model card's "how to load it" section
    # write(model, native export folder, out folder, card, dtype): dtype None is the format's default (float32, or a
    # converted model's source precision)
    write: Callable[[nn.Module, Path, Path, str, "torch.dtype | None"], None]
    # read(folder) -> (resolved spec, weights by blockforge's names; or None when the folder's model.safetensors holds
    # them so; or FileNames when it holds them so but for a few names), for a folder this format wrote; None for any
    # other folder (blockforge.load tries each format).
    read: "Callable[[Path], tuple[ResolvedSpec, dict | FileNames | None] | None] | None" = None


@dataclass(frozen=True)
class FileNames:
    """A weights file under blockforge's names but for these: blockforge's name -> the file's."""

    names: dict[str, str]


@contextmanager
def staging(out_dir: Path) -> Iterator[Path]:
    """A scratch folder inside `out_dir` (same file system, so publishing is a rename), removed afterwards."""
    stage = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def copy_records(native_dir: Path, stage: Path) -> None:
    for name in RECORDS:
        if (native_dir / name).is_file():
            shutil.copyfile(native_dir / name, stage / name)


def publish(stage: Path, out_dir: Path) -> None:
    """Move every file of `stage` into `out_dir`, each flushed to disk first, then renamed over its name."""
    for file in sorted(stage.iterdir()):
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(file, out_dir / file.name)


def front_matter(**fields) -> str:
    """The YAML header of a Hugging Face model card, written by a YAML dumper: any value reads back as itself."""
    import yaml

    return "---\n" + yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, width=10**6) + "---\n\n"
