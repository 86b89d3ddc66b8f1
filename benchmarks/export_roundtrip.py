"""Seventeen open decoders through blockforge and back: the table docs/howto/export-and-serve.md gives.

Each toy-size source (tests/hf_designs.py: random weights shaped by the real config, a tokenizer built as its
family builds them, a generation config, a card) is converted (`blockforge convert`) and exported (`--format hf`),
then loaded with transformers beside its source. Printed per design: the class it leaves as, the largest logit
difference at 64 tokens past its longest window, whether greedy generation, the tokenizer (20 texts, with and
without special tokens), the token ids and the generation config are the source's, whether peft has default
target modules for it, and the export's size in float32 and bfloat16.

    python benchmarks/export_roundtrip.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
from hf_designs import SOURCES, VOCAB, describe, make_source  # noqa: E402

import blockforge  # noqa: E402
from blockforge.export import export_run  # noqa: E402
from blockforge.tables import markdown_table  # noqa: E402


def main() -> None:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in SOURCES:
            src = make_source(name, root / "sources")
            native = blockforge.save(blockforge.from_hf(src), root / "native" / src.name)
            full = export_run(native, root / "fp32" / src.name, format="hf")
            half = export_run(native, root / "bf16" / src.name, format="hf", dtype="bf16")
            source, exported = AutoModelForCausalLM.from_pretrained(src).eval(), AutoModelForCausalLM.from_pretrained(full).eval()
            window = getattr(source.config, "sliding_window", None) or 0
            tokens = torch.randint(0, VOCAB, (2, window + 64), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                delta = (exported(tokens).logits - source(tokens).logits).abs().max().item()
            prompt = tokens[:1, :8]
            same = torch.equal(exported.generate(prompt, max_new_tokens=16, do_sample=False), source.generate(prompt, max_new_tokens=16, do_sample=False))
            theirs, ours = describe(full), describe(src)
            rows.append([name, type(exported).__name__, f"{delta:.1e}", "yes" if same else "NO",
                         "yes" if theirs["encodings"] == ours["encodings"] and theirs["special"] == ours["special"] else "NO",
                         "yes" if theirs["ids"] == ours["ids"] and theirs["generation"] == ours["generation"] else "NO",
                         "yes" if source.config.model_type in PEFT_DEFAULTS else "no (name them)",
                         f"{(full / 'model.safetensors').stat().st_size / 1e6:.2f} / {(half / 'model.safetensors').stat().st_size / 1e6:.2f}"])
    print(markdown_table(["source", "leaves as", "max |Δlogit|", "greedy equal", "tokenizer equal", "ids + generation config equal",
                          "peft defaults", "MB fp32 / bf16"], rows, "ll" + "r" * 6))
    print(f"\n{len(rows)} designs in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
