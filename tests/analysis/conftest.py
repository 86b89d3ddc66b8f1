"""Each test gets a private corpus/tokenizer cache, as in tests/train."""

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BLOCKFORGE_CACHE", str(tmp_path_factory.getbasetemp() / "blockforge-cache"))
