"""Adding a per-layer field is its declaration (spec/fields.py) plus the code where it acts: on a copy of the
package, a toy field declared in one entry and used in one module is authored, checked, set by rules,
shown by inspect, saved in spec.yaml and read back, hashed, searchable as a dotted key, and computes."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DECLARATION = '''
LAYER_FIELDS.append(LayerField("toy_gain", float, "the MLP's output times this", default=1.0, minimum=0, hashed=False,
                               plain="default", plain_says="a toy gain", module="mlp"))
'''

CHECK = '''
import torch, blockforge
from blockforge.errors import SpecError
from blockforge.spec import load_recipe, save_spec, load_spec
from blockforge.search.config import load_search
recipe = "{recipe}"
sets = [("model.layers.pattern", [{{"every": 2, "offset": 1, "set": {{"toy_gain": 3.0}}}}])]
with_gain = load_recipe(recipe, sets)
plain = load_recipe(recipe)
assert [layer.toy_gain for layer in with_gain.spec.layers] == [1.0, 3.0], with_gain.spec.layers
assert with_gain.spec.arch_hash() != plain.spec.arch_hash()
headers, rows = with_gain.spec.layer_table()
assert "toy_gain" in headers and "toy_gain" not in plain.spec.layer_table()[0]
save_spec(with_gain.spec, "spec.yaml")
assert "toy_gain: 3.0" in open("spec.yaml").read() and load_spec("spec.yaml") == with_gain.spec
try:
    load_recipe(recipe, [("model.layers.default.toy_gain", -1.0)])
    raise AssertionError("a negative toy_gain was accepted")
except SpecError as err:
    assert "model.layers.default.toy_gain: must be greater than zero" in str(err), err
a, b = blockforge.build_model(with_gain.spec, seed=0), blockforge.build_model(plain.spec, seed=0)
x = torch.randn(1, 5, a.spec.width)
torch.testing.assert_close(a.layers[1].mlp.branch(x), 3.0 * b.layers[1].mlp.branch(x))
torch.testing.assert_close(a.layers[0].mlp.branch(x), b.layers[0].mlp.branch(x))
plan = load_search("{search}")
print("ok", plan.dimensions[0].key)
'''

SEARCH = '''base: {recipe}
steps: 2
space:
  model.layers.overrides[0].toy_gain: {{uniform: [0.5, 2.0]}}
'''

RECIPE = '''model: {family: llama, width: 16, depth: 2, heads: 2, ffn: 32, vocab: 50, context: 8,
        layers: {overrides: [{at: 0, toy_gain: 1.0}]}}
data: {source: builtin}
'''


def test_a_toy_field_is_its_declaration_plus_the_code_where_it_acts(tmp_path):
    package = tmp_path / "blockforge"
    shutil.copytree(ROOT / "blockforge", package, ignore=shutil.ignore_patterns("__pycache__"))
    fields = package / "spec" / "fields.py"
    marker = "\n\ndef layer_field("
    text = fields.read_text()
    fields.write_text(text.replace(marker, DECLARATION + marker, 1))  # the declaration
    mlp = package / "nn" / "mlp.py"  # the code where it acts
    text = mlp.read_text()
    text = text.replace("def __init__(self, width: int, hidden: int, *, bias: bool = False, mlp_act: str | None = None):",
                        "def __init__(self, width: int, hidden: int, *, bias: bool = False, mlp_act: str | None = None, toy_gain: float = 1.0):", 1)
    text = text.replace("        self.act = activation(mlp_act, \"silu\")\n", "        self.act = activation(mlp_act, \"silu\")\n        self.toy_gain = toy_gain\n", 1)
    text = text.replace("        return self.down(self.act(gate) * up)", "        return self.down(self.act(gate) * up) * self.toy_gain", 1)
    text = text.replace("def __init__(self, width: int, hidden: int, *, bias: bool = True, mlp_act: str | None = None):",
                        "def __init__(self, width: int, hidden: int, *, bias: bool = True, mlp_act: str | None = None, toy_gain: float = 1.0):", 1)
    mlp.write_text(text)
    (tmp_path / "toy.yaml").write_text(RECIPE)
    (tmp_path / "search.yaml").write_text(SEARCH.format(recipe="toy.yaml"))
    script = CHECK.format(recipe=tmp_path / "toy.yaml", search=tmp_path / "search.yaml")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                               "BLOCKFORGE_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0 and done.stdout.strip() == "ok model.layers.overrides[0].toy_gain", done.stderr[-3000:]
