"""Training tests use a tiny recipe on a generated local corpus, so they take seconds."""

from pathlib import Path

import pytest

from tiny_data import write_recipe


@pytest.fixture
def recipe_file(tmp_path: Path):
    """A function: recipe_file(**train_overrides) -> path of a tiny recipe YAML."""

    def make(name: str = "tiny.yaml", **train) -> Path:
        return write_recipe(tmp_path, name, **train)

    return make

