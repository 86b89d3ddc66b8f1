"""Mutated valid recipes either load or raise SpecError; nothing else ever escapes the loader."""

import copy
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockforge.errors import SpecError
from blockforge.spec import read_composed, recipe_from_data

BASES = [read_composed(p) for p in sorted(Path("recipes").glob("*.yaml")) if "7b" not in p.name]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["pre", "post", "deepnorm", "0:3", "-1:", "::2", "1e-3", "llama", "vit"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _paths(child, prefix + (i,))


@st.composite
def mutated(draw):
    data = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(values)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_recipe_loads_or_raises_spec_error(data):
    try:
        recipe_from_data(data, file="mutated.yaml")
    except SpecError as err:
        assert str(err).startswith("mutated.yaml")
