"""README.md and the pages under docs/ name only what exists: every `blockforge` subcommand and flag they write (with
the values they give it), every repository file, folder and make target, and every recipe or search-file key (in YAML
blocks and as dotted keys) is checked against the code. No mkdocs needed: the key sets are the ones
docs/gen_reference.py generates the reference pages from. The checkers are tested on wrong lines too. Every line of
every bash block is run in document order in a fresh folder (as written, or as its --plan/--help twin; the expensive
ones as written in the slow test), or marked on the page with the reason it cannot run here."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import itertools
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
REPO_DIRS = ("searches", "recipes", "benchmarks", "docs", "tests", "blockforge")
FILE_EXTENSIONS = {"json", "jsonl", "py", "yaml", "yml", "md", "png", "csv", "safetensors", "journal", "gguf", "txt", "sbatch"}
SHELL_STOPS = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1"}


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


# ---- reading markdown -----------------------------------------------------------------------------------------------


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line of the opening fence) of each fenced code block, indented ones (in lists) included."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = re.match(r"^(\s*)(```+)\s*([\w+-]*)", lines[i])
        if match:
            indent, fence, lang = match.groups()
            body, start = [], i + 1
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            blocks.append((lang.lower(), "\n".join(body), start))
        i += 1
    return blocks


def prose(text: str) -> str:
    """The text outside fenced code blocks (their lines blanked, so line numbers stay)."""
    out, fence = [], None
    for line in text.splitlines():
        match = re.match(r"^\s*(```+)", line)
        if fence is None and match:
            fence = match.group(1)
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def inline_spans(text: str) -> list[tuple[str, int]]:
    """(content, line) of each inline code span outside fenced blocks."""
    body = prose(text)
    return [(" ".join(m.group(2).split()), body.count("\n", 0, m.start()) + 1) for m in re.finditer(r"(`+)([^`]+?)\1", body)]


def code_texts(text: str) -> list[tuple[str, int, str]]:
    """Every piece of code a page shows: (text, line, language; 'inline' for a span)."""
    return [(span, line, "inline") for span, line in inline_spans(text)] + [(body, line, lang) for lang, body, line in fenced_blocks(text)]


# ---- commands -------------------------------------------------------------------------------------------------------

PARSER, COMMANDS = gen.commands()


def _tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an apostrophe in running text
        return line.split("#", 1)[0].split()


def command_lines(text: str, lang: str) -> list[str]:
    """Shell command lines of a code text that run `blockforge`, continuation lines joined."""
    if lang in ("python", "py", "text"):
        return []
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if re.search(r"(^|[\s/:])blockforge\s+[a-z]", line.split("#", 1)[0])]


def _placeholder(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_=.,-]*", value)) or "$" in value or "..." in value or "<" in value


def command_problems(line: str) -> list[str]:
    """What a documented `blockforge ...` command line names that its parser does not have."""
    tokens = _tokens(line)
    problems = []
    for i, token in enumerate(tokens):
        if not (token == "blockforge" or token.endswith("/blockforge")) or i + 1 >= len(tokens):
            continue
        if i and tokens[i - 1] in ("import", "from", "install", "uninstall"):
            continue
        name = tokens[i + 1]
        if name not in COMMANDS:
            problems.append(f"`blockforge {name}`: no such subcommand (there are: {', '.join(COMMANDS)})")
            continue
        problems += _argument_problems(name, COMMANDS[name], tokens[i + 2:])
    return problems


def _argument_problems(name: str, parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    problems, positionals, j = [], 0, 0
    actions = parser._option_string_actions
    most = sum(1 for a in parser._actions if not a.option_strings and a.nargs in (None, 1))
    if any(not a.option_strings and a.nargs in ("+", "*") for a in parser._actions):
        most = float("inf")
    while j < len(args):
        arg = args[j].strip("[]")
        j += 1
        if args[j - 1] in SHELL_STOPS or arg.startswith(">"):
            break
        if not arg or arg == "...":
            continue
        if not arg.startswith("-"):
            positionals += 1
            continue
        flag, eq, value = arg.partition("=")
        action = actions.get(flag)
        if action is None:
            problems.append(f"`blockforge {name} {flag}`: no such flag")
            continue
        if action.nargs == 0:
            continue
        if not eq:
            if j < len(args) and not args[j].strip("[]").startswith("-") and (
                    action.nargs != "?" or args[j].strip("[]") in map(str, action.choices or ())):
                value = args[j].strip("[]")
                j += 1
            else:
                continue
        if action.choices and not _placeholder(value) and value not in map(str, action.choices):
            problems.append(f"`blockforge {name} {flag} {value}`: not one of {', '.join(map(str, action.choices))}")
    if positionals > most:
        problems.append(f"`blockforge {name}`: {positionals} positional arguments, it takes {most}")
    return problems


# ---- files, folders and make targets --------------------------------------------------------------------------------

PATH = re.compile(rf"(?<![\w/.$~-])((?:{'|'.join(REPO_DIRS)})/[\w.*{{}},/-]*[\w*}}/])")
MAKE_TARGETS = set(re.findall(r"^([\w.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), flags=re.M))


def _expand(path: str) -> list[str]:
    """Brace alternatives written out: llama-{tiny,130m}-mix.yaml -> both."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return list(itertools.chain.from_iterable(_expand(path[:match.start()] + part + path[match.end():]) for part in match.group(1).split(",")))


def path_problems(text: str) -> list[str]:
    """Repository paths a code text names that do not exist (a glob must match something)."""
    problems = []
    for path in PATH.findall(text):
        for one in _expand(path.rstrip(".,")):
            if re.search(r"(^|/)[A-Z][A-Z_]*(\.|/|$)", one):  # a placeholder: searches/NAME.yaml
                continue
            found = glob.glob(str(ROOT / one)) if "*" in one else [one] if (ROOT / one).exists() else []
            if not found:
                problems.append(f"`{one}`: no such file or folder in the repository")
    return problems


def make_problems(text: str) -> list[str]:
    return [f"`make {target}`: no such target in the Makefile" for target in re.findall(r"(?:^|[\s`])make\s+([a-z][\w-]*)", text)
            if target not in MAKE_TARGETS]


def link_problems(page: Path, text: str) -> list[str]:
    """Relative markdown links whose target is not in the repository (nor a page the reference generates)."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        generated = {(ROOT / "docs" / p).resolve() for p in gen.PAGES}
        if not path.exists() and path not in generated:
            problems.append(f"link to {target}: no such file")
    return problems


# ---- keys -----------------------------------------------------------------------------------------------------------

RECIPE, SEARCH = gen.recipe_keys(), gen.search_keys()
KEY = r"[a-z_]\w*(?:\.[a-z_]\w*|\[\d+\])+"


def _is_file(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in FILE_EXTENSIONS


def dotted_key_problems(span: str) -> list[str]:
    """A span that is a dotted key (maybe `= value` or `: value`, maybe after --set) naming a key the code lacks."""
    match = re.fullmatch(rf"(?:--set\s+)?({KEY})(?:\s*[=:].*)?", span)
    if not match or _is_file(match.group(1)):
        return []
    key = match.group(1)
    root = re.split(r"[.\[]", key, maxsplit=1)[0]
    if root in RECIPE.children and root != "base":
        return [] if gen.known_recipe_key(key) else [f"`{key}`: no such recipe key"]
    if root in SEARCH.children:
        return [] if gen.known_search_key(key) else [f"`{key}`: no such search-file key"]
    return []


def set_problems(text: str) -> list[str]:
    """Each `--set KEY=VALUE` of a command names a recipe or search-file key."""
    problems = []
    for key in re.findall(r"--set[ =]([^\s=]+)=", text):
        if _placeholder(key) or gen.known_recipe_key(key) or gen.known_search_key(key):
            continue
        problems.append(f"`--set {key}`: no such recipe or search-file key")
    return problems


def yaml_problems(body: str) -> list[str]:
    """The keys of a documented YAML block (a recipe, a search file, or a part of one) that the code does not know."""
    try:
        data = yaml.safe_load(body)
    except yaml.YAMLError as err:
        return [f"YAML block does not parse: {str(err).splitlines()[0]}"]
    if not isinstance(data, dict):
        return []
    candidates = [RECIPE, SEARCH, RECIPE.children["model"]]
    best = max(candidates, key=lambda node: sum(key in node.children for key in data))
    if not any(key in best.children for key in data):
        return []  # not a blockforge file (a Kubernetes manifest)
    where = best.key + "." if best.key else ""
    return [f"`{where}{bad}`: no such key" for bad in gen.unknown_keys(data, best)]


def table_problems(text: str) -> list[str]:
    """Tables whose first column is `field` or `placement` list per-layer fields or placements that exist."""
    from blockforge.spec.model import LayerSettings
    from blockforge.spec.placements import PLACEMENTS

    known = {"field": {f for f in LayerSettings.__dataclass_fields__}, "placement": set(PLACEMENTS)}
    problems, kind = [], None
    for line in prose(text).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.strip().startswith("|") else None
        if cells is None:
            kind = None
        elif kind is None:
            kind = cells[0] if cells[0] in known else ""
        elif kind and not set(cells[0]) <= set("-: "):
            problems += [f"`{name}`: no such {kind}" for name in re.findall(r"`([^`]+)`", cells[0]) if name not in known[kind]]
    return problems


# ---- the pages ------------------------------------------------------------------------------------------------------


def page_problems(page: Path) -> list[str]:
    text = page.read_text()
    problems = [f"{p}" for p in link_problems(page, text) + table_problems(text)]
    for code, line, lang in code_texts(text):
        found = path_problems(code) + make_problems(code) + set_problems(code)
        found += [p for command in command_lines(code, lang) for p in command_problems(command)]
        if lang == "inline":
            found += dotted_key_problems(code)
        if lang in ("yaml", "yml"):
            found += yaml_problems(code)
        problems += [f"line {line}: {p}" for p in found]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_names_only_what_exists(page):
    problems = page_problems(page)
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 300
    first = fenced_blocks(text)[0][1].splitlines()
    assert [line.split()[:2] for line in first] == [["make", "quickstart"], ["make", "test"]]


def test_the_reference_pages_are_generated_from_the_code():
    pages = gen.pages()  # also refuses a note on a key the code no longer declares
    assert set(pages) == set(gen.PAGES)
    for name in COMMANDS:
        assert f"## blockforge {name}" in pages["reference/cli.md"]
        assert all(flag in pages["reference/cli.md"] for action in COMMANDS[name]._actions for flag in action.option_strings)
    for key in SEARCH.children:
        assert f"`{key}`" in pages["reference/search-file.md"]
    for section in ("model", "train", "data"):
        assert all(f"`{child.key}`" in pages["reference/recipe.md"] for child in RECIPE.children[section].children.values())
    for name in COMMANDS["search"]._option_string_actions:
        assert name in pages["reference/cli.md"]
    import blockforge

    for name in blockforge.__all__:  # the Python API: every exported name, the search view's methods with their docstrings
        assert f"## `blockforge.{name}`" in pages["reference/python.md"]
    for method in ("results", "cells", "law", "best", "export", "curves", "refresh"):
        assert f"### `.{method}(" in pages["reference/python.md"] and getattr(blockforge.Search, method).__doc__.split("\n")[0] in pages["reference/python.md"]


def test_every_documented_figure_is_shown_somewhere():
    shown = {Path(m).name for page in PAGES for m in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())}
    assert {p.name for p in (ROOT / "docs" / "figures").glob("*.png")} <= shown


# ---- the commands the pages print, run as written ---------------------------------------------------------------------


def printed_command(page: str, start: str) -> list[str]:
    """The one command on `page` that starts with `start` (in a code block or an inline span), as argv after `blockforge`."""
    text = (ROOT / page).read_text()
    lines = [line.split(" #")[0].strip() for _, body, _ in fenced_blocks(text) for line in body.splitlines()]
    lines += [span for span, _ in inline_spans(text)]
    found = [line for line in lines if line.startswith(start)]
    assert len(found) == 1, f"{page}: {len(found)} commands start with {start!r}"
    return shlex.split(found[0])[1:]


def plan_total(out: str) -> int:
    """The worst-case trials on the total row of a printed compute plan."""
    row = next(line for line in out.splitlines() if line.startswith("total"))
    return int(row.split()[-2])


def test_the_try_it_faster_line_runs_apart_from_the_quickstart_and_says_what_it_costs(capsys, monkeypatch):
    from blockforge.cli import main

    monkeypatch.chdir(ROOT)
    faster = printed_command("docs/getting-started.md", "blockforge search searches/quickstart.yaml --set steps=60")
    out = faster[faster.index("--out") + 1]
    assert out != "runs/search-quickstart" and "--resume" not in faster  # its own folder: the quickstart's is not in its way
    plans = {}
    for name, argv in {"quickstart": ["search", "searches/quickstart.yaml"], "faster": faster,
                       "fewer trials": ["search", "searches/quickstart.yaml", "--set", "trials_per_cell=4"]}.items():
        capsys.readouterr()
        assert main([*argv, "--plan"]) == 0, name
        plans[name] = plan_total(capsys.readouterr().out)
    page = (ROOT / "docs" / "getting-started.md").read_text()
    assert plans["faster"] == plans["quickstart"] and f"the same {plans['quickstart']} trials at most" in page
    assert f"from {plans['quickstart']} trials to {plans['fewer trials']}" in " ".join(page.split())


def test_the_readme_generate_line_runs_on_a_model_whose_context_is_short(tmp_path, capsys):
    from blockforge.cli import main
    from tiny_data import write_recipe

    argv = printed_command("README.md", "blockforge generate models/best-d8")
    recipe = write_recipe(tmp_path, steps=2, eval_every=0, checkpoint_every=0, grad_norm_every=0)  # context 32, as short as any
    assert main(["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main([argv[0], str(tmp_path / "run"), *argv[2:]]) == 0
    err = capsys.readouterr().err
    assert "new tokens (the model's context of 32 less the prompt's" in err and "Traceback" not in err


def test_the_main_job_exports_a_folder_transformers_loads_and_says_how():
    make = (ROOT / "Makefile").read_text()
    export = next(line for line in make.splitlines() if "blockforge export $(QUICKSTART_OUT)" in line)
    assert "--format hf" in export  # plain transformers loads it (a Mix-LN winner with trust_remote_code=True)
    assert re.search(r"^models/$", (ROOT / ".gitignore").read_text(), re.M)  # the README's models/ is not committed by accident


# ---- the checkers fail on wrong lines -------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    "blockforge serach searches/quickstart.yaml",                   # no such subcommand
    "blockforge search searches/quickstart.yaml --no-such-flag",   # no such flag
    "blockforge export runs/tiny --out m --format onnx",           # a value outside the choices
    'blockforge generate models/tiny "The"',                       # a prompt given as a second positional
])
def test_a_wrong_command_is_found(line):
    assert command_problems(line)


def test_a_right_command_passes():
    assert not command_problems("blockforge search searches/quickstart.yaml --out runs/s --resume=auto --set confirm.seeds=3")
    assert not command_problems("torchrun --nproc_per_node=4 -m blockforge train recipes/llama-1b-mix.yaml --out runs/1b")
    assert not command_problems("blockforge export SEARCH --cell CELL --pick N [--retrain] --format hf --out DIR")


def test_wrong_paths_targets_and_keys_are_found():
    assert path_problems("see `searches/no-such-search.yaml`") and not path_problems("`searches/quickstart.yaml`")
    assert path_problems("recipes/llama-*-nothing.yaml") and not path_problems("recipes/llama-*-openelm.yaml")
    assert not path_problems("--out /shared/searches/alpha-law or s3://bucket/recipes/x or searches/NAME.yaml")
    assert make_problems("make quickstrat") and not make_problems("make test-slow")
    assert dotted_key_problems("model.layers.mix_ln.alfa") and not dotted_key_problems("model.layers.overrides[0].window=64")
    assert dotted_key_problems("confirm.lr.grids") and not dotted_key_problems("scheduler.asha.margin: X")
    assert not dotted_key_problems("data.json") and not dotted_key_problems("cells.model.depth=[4,8]")
    assert dotted_key_problems("cells.model.dpeth=[4,8]")
    assert set_problems("blockforge search F --set trials_per_cel=4") and not set_problems("--set train.lr=0.003")
    assert yaml_problems("confirm: {top: 2, seedz: 2}") and not yaml_problems("confirm: {top: 2, seeds: 2}")
    assert yaml_problems("space:\n  model.layers.mix_ln.alfa: {uniform: [0, 0.5]}")
    assert yaml_problems("constraints: {kv_cache: {max: 1}}") and not yaml_problems("constraints: {kv_cache_bytes: {max: 1}}")
    assert yaml_problems("model:\n  family: llama\n  layers:\n    default: {placment: pre}")
    assert yaml_problems("  layers:\n    ramp: {hedas: [0.5, 1.0]}") and not yaml_problems("  layers:\n    ramp: {heads: [0.5, 1.0]}")
    assert not yaml_problems("apiVersion: ray.io/v1\nkind: RayJob")
    assert table_problems("| field | values |\n|---|---|\n| `window`, `windw` | x |\n")
    assert not table_problems("| placement | formula |\n|---|---|\n| `pre` | x |\n")


# ---- every bash block: run in document order, or marked with why it cannot run here ---------------------------------
#
# The pages are read as a reader would: README, then the site's pages in mkdocs.yml's order, each bash block's lines one
# after another, in one fresh folder holding a copy of recipes/ and searches/ (so `runs/tiny` trained on one page is the
# one a later page exports). A block that cannot run on a two-core machine without the network says so right before its
# fence, for readers of the page source as for this test:
#
#     <!-- not run here: REASON -->                          the whole block
#     <!-- not run here: "PATTERN", "PATTERN": REASON; ... -->   the block's lines that contain a pattern
#
# Every other line is run: as written, or as its twin, the cheap form of a command too long for the default suite (a
# search's --plan: the file, its --set keys and cells checked, its compute plan printed, nothing trained; --help: the
# command and its flags parse; make -n: the target and what it would run). RUNS says which, per command; the slow test
# runs the expensive ones as written (the two searches shortened by SHORTER, the same --set on every line that runs or
# resumes them). A line the same as one run before it (README's tour, repeated on a concept page) is not run again:
# run twice, its folder already holds its result and it is refused, as it should be.

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
MARKER = re.compile(r"^\s*<!--\s*not run here:\s*(.*?)\s*-->\s*$")
AS_WRITTEN, PLAN, HELP, MAKE_N, COMPILE, SLOW_ONLY = "as written", "twin: --plan", "twin: --help", "twin: make -n", "twin: compiled", "slow only"

# (the command, how the default suite runs it, how the slow test runs it), first match wins.
RUNS = [
    (r"blockforge (inspect|schema|(search|prepare) .*--plan)\b", AS_WRITTEN, AS_WRITTEN),  # nothing is trained: seconds
    (r"blockforge search ", PLAN, AS_WRITTEN),                        # minutes of training (shortened by SHORTER)
    (r"blockforge (train|prepare|eval|analyze|export|generate) ", HELP, AS_WRITTEN),  # trains, or reads what training wrote
    (r"python -c ", COMPILE, AS_WRITTEN),                             # reads a finished search
    (r"make [\w-]+$", MAKE_N, MAKE_N),      # installs .venv from PyPI and runs a suite (this one too) or the quickstart,
                                            # whose two commands getting-started prints and this test runs
    (r"python benchmarks/export_roundtrip\.py$", SLOW_ONLY, AS_WRITTEN),  # 15 s, and no flags: --help would run it
    (r"python benchmarks/\w+\.py", HELP, HELP),  # minutes to hours of measuring; tests/test_benchmarks.py runs them small
]
# The slow test's shortening of the searches the pages run (the quickstart's is the one getting-started prints).
SHORTER = {"searches/quickstart.yaml": ["--set", "steps=60"], "searches/kv-pareto-cpu.yaml": ["--set", "steps=60"]}


@dataclasses.dataclass(frozen=True)
class Step:
    """One command line of a bash block and how the default suite and the slow test take it."""
    page: str
    line: int
    words: tuple[str, ...]
    default: str   # AS_WRITTEN, a twin, SLOW_ONLY, "repeat of PAGE:LINE" or "not run here: REASON"
    slow: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def text(self) -> str:
        return shlex.join(self.words)


def reading_order() -> list[Path]:
    """README, then the site's pages as mkdocs.yml's nav lists them, then any page it leaves out."""
    def names(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for value in node.values():
                yield from names(value)
        elif isinstance(node, list):
            for item in node:
                yield from names(item)

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    ordered = [ROOT / "README.md"] + [ROOT / "docs" / name for name in names(nav) if (ROOT / "docs" / name).is_file()]
    return ordered + [page for page in PAGES if page not in ordered]


def parse_marker(text: str) -> tuple[str | None, dict[str, str]]:
    """A marker's reason for the whole block, or its reasons by line pattern."""
    if not text.startswith('"'):
        return text, {}
    reasons = {}
    for part in text.split(";"):
        match = re.fullmatch(r'\s*((?:"[^"]+"\s*,?\s*)+):\s*(\S.*?)\s*', part)
        if not match:
            raise ValueError(f"marker {text!r}: write it as \"PATTERN\", \"PATTERN\": REASON; ...")
        reasons.update({pattern: match.group(2) for pattern in re.findall(r'"([^"]+)"', match.group(1))})
    return None, reasons


def block_lines(body: str) -> list[tuple[int, list[str]]]:
    """(offset in the block, words) of each command line of a shell block, continuation lines joined, comments left out."""
    found, pending, first = [], "", 0
    for offset, line in enumerate(body.splitlines()):
        if not pending:
            first = offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = _tokens(pending + line)
        pending = ""
        if words:
            found.append((first, words))
    return found


def how_run(words: list[str]) -> tuple[str, str] | None:
    if any(word in SHELL_STOPS for word in words):
        return None
    line = shlex.join(words)
    return next(((default, slow) for pattern, default, slow in RUNS if re.match(pattern, line)), None)


def walkthrough() -> tuple[list[Step], list[str]]:
    """Every command line of every bash block in reading order, with how it is run; and the problems: a line neither
    run nor marked, a marker that does not parse or names no line of its block."""
    steps, problems, seen = [], [], {}
    for page in reading_order():
        name = str(page.relative_to(ROOT))
        lines = page.read_text().splitlines()
        for lang, body, fence in fenced_blocks(page.read_text()):
            if lang not in SHELL_LANGS:
                continue
            marker = MARKER.match(lines[fence - 2]) if fence >= 2 else None
            try:
                whole, by_pattern = parse_marker(marker.group(1)) if marker else (None, {})
            except ValueError as err:
                problems.append(f"{name}:{fence - 1}: {err}")
                continue
            commands = block_lines(body)
            for pattern in by_pattern:
                if not any(pattern in " ".join(words) for _, words in commands):
                    problems.append(f"{name}:{fence - 1}: the marker's {pattern!r} is in no line of the block below it")
            for offset, words in commands:
                where = f"{name}:{fence + 1 + offset}"
                reason = whole or next((why for pattern, why in by_pattern.items() if pattern in " ".join(words)), None)
                key = tuple(words)
                if reason:
                    how = (f"not run here: {reason}",) * 2
                elif key in seen:
                    how = (f"repeat of {seen[key]}",) * 2
                else:
                    how = how_run(words)
                    if how is None:
                        problems.append(f"{where}: `{shlex.join(words)}` is neither run by this test (RUNS) nor marked "
                                        "<!-- not run here: ... --> with its reason")
                        continue
                    seen[key] = where
                steps.append(Step(name, fence + 1 + offset, key, *how))
    return steps, problems


def test_every_bash_block_is_run_or_marked_with_its_reason():
    steps, problems = walkthrough()
    assert not problems, "\n".join(problems)
    assert steps and all(step.default != SLOW_ONLY or step.slow == AS_WRITTEN for step in steps)


def test_a_line_neither_run_nor_marked_is_found(tmp_path, monkeypatch):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("```bash\nray start --head\nblockforge inspect recipes/x.yaml | head\n```\n\n"
                    "<!-- not run here: \"s3://\": a bucket -->\n```bash\nblockforge train recipes/x.yaml --out runs/x\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    (tmp_path / "mkdocs.yml").write_text("nav:\n  - Page: page.md\n")
    (tmp_path / "README.md").write_text("<!-- not run here: a GPU -->\n```bash\ntorchrun x\n```\n")
    steps, problems = walkthrough()
    assert [p.split(": ", 1)[0] for p in problems] == ["docs/page.md:2", "docs/page.md:3", "docs/page.md:6"]
    assert [(s.where, s.default) for s in steps] == [("README.md:3", "not run here: a GPU"), ("docs/page.md:8", HELP)]
    assert parse_marker('"a", "b": x; "c": y') == (None, {"a": "x", "b": "x", "c": "y"})


def _docs_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "reader"
    for name in ("recipes", "searches"):
        shutil.copytree(ROOT / name, folder / name)
    return folder


def _run(step: Step, how: str, folder: Path) -> tuple[int, str]:
    """Run `step` the way `how` says, in `folder`: its exit status and what it printed."""
    import contextlib
    import io
    import runpy
    import subprocess

    words = list(step.words)
    if how == MAKE_N:
        done = subprocess.run(["make", "-n", "-C", str(ROOT), *words[1:]], capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr
    if how == COMPILE:
        compile(words[2], step.where, "exec")
        return 0, ""
    if words[0] == "python" and words[1] == "-c":
        done = subprocess.run([sys.executable, *words[1:]], cwd=folder, capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr
    out = io.StringIO()
    if words[0] == "python":  # a benchmark, from the repository (it finds its neighbours by its own path)
        argv = [str(ROOT / words[1]), *(["--help"] if how == HELP else words[2:])]
        saved_argv, saved_path = sys.argv, list(sys.path)
        sys.argv = argv
        try:
            with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
        return code, out.getvalue()
    from blockforge.cli import main

    argv = words[1:]
    if how == PLAN:
        argv = [word for word in argv if not word.startswith("--resume")] + ["--plan"]
    elif how == HELP:
        argv = [*argv, "--help"]
    else:
        argv += SHORTER.get(argv[1], []) if argv[0] == "search" else []
    with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


def _walk(tmp_path: Path, slow: bool) -> tuple[Path, list[tuple[Step, str, float]], list[str]]:
    """Every step run in order, with the time each took; and the failures (a step after a failure runs all the same, so
    one run names every line that fails, those that fail only because an earlier one did among them)."""
    import time

    steps, problems = walkthrough()
    assert not problems, "\n".join(problems)
    folder, done, failed = _docs_folder(tmp_path), [], []
    for step in steps:
        how = step.slow if slow else step.default
        if how.startswith(("not run here", "repeat of")) or how == SLOW_ONLY:
            done.append((step, how, 0.0))
            continue
        started = time.monotonic()
        code, printed = _run(step, how, folder)
        if code != 0:
            failed.append(f"{step.where}: `{step.text}` ({how}) exited {code}:\n{printed[-3000:]}")
        done.append((step, how, time.monotonic() - started))
        print(f"{done[-1][2]:7.1f} s  {how:<13}  {step.where}  exit {code}", flush=True)  # shown with -s, as it goes
    return folder, done, failed


def _report(done: list[tuple[Step, str, float]]) -> str:
    counts = {}
    for _, how, _ in done:
        kind = how.split(":")[0] if how.startswith(("not run here", "twin")) else how.split(" of ")[0]
        counts[kind] = counts.get(kind, 0) + 1
    rows = "\n".join(f"{seconds:7.1f} s  {how:<28.28}  {step.where:<42} {step.text[:90]}" for step, how, seconds in done)
    return rows + "\n" + ", ".join(f"{n} {kind}" for kind, n in counts.items())


def test_the_documented_commands_run_in_document_order_or_as_their_twins(tmp_path):
    _, done, failed = _walk(tmp_path, slow=False)
    print(_report(done))
    assert not failed, "\n\n".join(failed)
    assert any(how == AS_WRITTEN for _, how, _ in done) and any(how == PLAN for _, how, _ in done)


@pytest.mark.slow
def test_the_documented_commands_run_as_written_in_document_order(tmp_path):
    """Every line that can run here, run as written in one folder (the two searches shortened), then the Python lines
    that load the transformers export: its pipeline prints what its greedy generate prints, and so does blockforge."""
    import contextlib
    import io

    from blockforge.cli import main

    folder, done, failed = _walk(tmp_path, slow=True)
    print(_report(done))
    assert not failed, "\n\n".join(failed)
    text = (ROOT / "docs" / "howto" / "export-and-serve.md").read_text()
    block = next(body for lang, body, _ in fenced_blocks(text) if lang == "python" and "pipeline(" in body)
    printed = []
    with contextlib.chdir(folder):
        exec(compile(block, "export-and-serve.md", "exec"), {"print": lambda *args: printed.append(" ".join(map(str, args)))})
    assert len(printed) == 2 and printed[0] == printed[1], printed
    out = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stdout(out):
        assert main(["generate", "models/tiny-hf", "--prompt", "The model", "--max-new-tokens", "40"]) == 0
    assert out.getvalue() == printed[0] + "\n", (out.getvalue(), printed[0])  # blockforge ends its text with a newline
