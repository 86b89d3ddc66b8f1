"""YAML is read strictly: what safe_load would accept silently but no spec means is refused by name."""

import pytest

from blockforge.errors import SpecError
from blockforge.spec import parse_assignment
from blockforge.spec.strict_yaml import load_text


@pytest.mark.parametrize("text,where", [
    ("model:\n  depth: 3\n  width: 8\n  depth: 4\n", "f.yaml: model.depth: line 4: 'depth' is given twice in one mapping (first on line 2)"),
    ("a: {b: 1, b: 2}\n", "f.yaml: a.b: line 1: 'b' is given twice"),
    ("model:\n  layers:\n    overrides:\n    - {at: 1:3, placement: post}\n",
     "f.yaml: model.layers.overrides[0].at: line 4: 1:3 is read by YAML 1.1 as the base-60 number 63; quote it: at: '1:3'"),
    ("at: [0, 2:30]\n", "f.yaml: at[1]: line 1: 2:30 is read by YAML 1.1 as the base-60 number 150; quote it: '2:30'"),
    ("lr: 1:30.5\n", "base-60 number 90.5"),
    ("a: &a [1, *a]\n", "f.yaml: a[1]: refers to itself"),
])
def test_refused_with_file_line_and_key_path(text, where):
    with pytest.raises(SpecError) as caught:
        load_text(text, file="f.yaml")
    assert where in str(caught.value)


@pytest.mark.parametrize("text,data", [
    ("at: '1:3'\n", {"at": "1:3"}),  # quoted: the slice text
    ("at: 0:3\n", {"at": "0:3"}),  # not a base-60 number in YAML 1.1 (no leading zero), so text already
    ("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}}),  # merge keys may be overridden
    ("a: &a [1, 2]\nb: *a\n", {"a": [1, 2], "b": [1, 2]}),
    ("", None),
])
def test_ordinary_yaml_reads_as_before(text, data):
    assert load_text(text, file="f.yaml") == data


def test_a_set_value_that_looks_base_60_keeps_its_text():
    assert parse_assignment("model.layers.overrides.0.at=1:3").value == "1:3"
    assert parse_assignment("model.depth=12").value == 12
    with pytest.raises(SpecError, match="given twice"):
        parse_assignment("data.tokenizer={bpe: 1, bpe: 2}")
