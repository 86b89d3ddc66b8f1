"""`blockforge schema`: the JSON Schema of a recipe or a search file, for editors that check YAML as it is typed.

Point an editor at it (a `# yaml-language-server: $schema=...` line, or VS Code's `yaml.schemas` setting) and it completes
keys, shows each key's meaning, and flags an unknown key, a wrong type or a value out of range as it is typed. The schema
is read from the same declarations as the parser (blockforge/schema.py); the parser stays the judge.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    from blockforge.schema import KINDS

    p = sub.add_parser("schema", help="print the JSON Schema of a recipe or a search file, for editors to check YAML as it is typed",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("kind", choices=KINDS, help="recipe (recipes/*.yaml) or search (searches/*.yaml)")
    p.add_argument("--out", metavar="FILE", help="write it to this file instead of printing it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from blockforge.schema import schema_text

    text = schema_text(args.kind)
    if args.out is None:
        print(text, end="")
        return 0
    from blockforge.io import atomic_write_text

    atomic_write_text(args.out, text)
    print(f"wrote {args.out}")
    return 0
