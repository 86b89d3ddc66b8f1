"""docs/cluster.md's Slurm script and KubeRay manifest stay true: they parse, and their blockforge command lines
plan (`--plan`: the search file, its --out and flags are read, nothing runs)."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from blockforge.cli import main

DOC = Path(__file__).parent.parent / "docs" / "cluster.md"


def block(name: str) -> str:
    """The fenced code block of docs/cluster.md whose first lines say `# file: NAME`."""
    for text in re.findall(r"```[a-z]*\n(.*?)```", DOC.read_text(), flags=re.S):
        if re.search(rf"^# file: {re.escape(name)}\b", text, flags=re.M):
            return text
    raise AssertionError(f"docs/cluster.md has no code block for {name}")


def planned(command: str, variables: dict[str, str]) -> list[str]:
    """A documented `blockforge search ...` line as arguments for --plan: variables filled in, and the flags that run
    something (the cluster's address, resuming) left out, as --plan asks."""
    for name, value in variables.items():
        command = command.replace(f'"${name}"', value).replace(f"${name}", value)
    args = shlex.split(command)
    assert args[:2] == ["blockforge", "search"], command
    out, i = [], 2
    while i < len(args):
        if args[i] == "--address":
            i += 2
            continue
        if not args[i].startswith("--resume"):
            out.append(args[i])
        i += 1
    return ["search", *out, "--plan"]


def test_the_slurm_script_parses_and_its_search_plans(capsys, monkeypatch):
    script = block("search.sbatch")
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    directives = re.findall(r"^#SBATCH (--[a-z-]+)", script, flags=re.M)
    assert {"--nodes", "--gpus-per-node", "--requeue", "--signal"} <= set(directives)
    defaults = dict(re.findall(r"^(\w+)=\$\{\1:-([^}]+)\}", script, flags=re.M))  # SEARCH=${SEARCH:-...}
    assert defaults["OUT"].startswith("s3://")
    commands = [line.strip().rstrip("&").strip() for line in script.splitlines() if line.strip().startswith("blockforge search")]
    assert len(commands) == 1 and "--resume=auto" in commands[0] and "trap 'kill -TERM" in script
    monkeypatch.chdir(DOC.parent.parent)
    assert main(planned(commands[0], defaults)) == 0
    assert "Compute plan" in capsys.readouterr().out


def test_the_rayjob_manifest_parses_and_its_search_plans(capsys, monkeypatch):
    job = yaml.safe_load(block("rayjob-search.yaml"))
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # the head drives; trials run on workers
    pods = [cluster["headGroupSpec"]["template"]] + [group["template"] for group in cluster["workerGroupSpecs"]]
    for pod in pods:  # every pod gets the storage's credentials from a Secret, none are written here
        for container in pod["spec"]["containers"]:
            assert any("secretRef" in source for source in container["envFrom"])
            assert not any(e["name"].startswith("AWS_SECRET") or e["name"].startswith("AWS_ACCESS") for e in container.get("env", []))
    entrypoint = spec["entrypoint"]
    assert "--address auto" in entrypoint and "--out s3://" in entrypoint and "--resume=auto" in entrypoint
    monkeypatch.chdir(DOC.parent.parent)
    assert main(planned(entrypoint, {})) == 0
    assert "Compute plan" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["search.sbatch", "rayjob-search.yaml"])
def test_the_documented_search_files_exist(name):
    text = block(name)
    for path in re.findall(r"(searches/[\w.-]+\.yaml)", text):
        assert (DOC.parent.parent / path).is_file(), path
