# Set-up and the everyday commands. `make quickstart` and `make test` each create .venv on first use.
VENV ?= .venv
PYTHON ?= python3
# The torch build to install; on this project's CPU machines both come from local disk.
TORCH ?= torch==2.14.1 torchvision==0.29.1
BIN := $(VENV)/bin

.PHONY: quickstart test test-slow install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The main job: an alpha search on the built-in corpus, then the best depth-8 model exported.
QUICKSTART_OUT ?= runs/search-quickstart
quickstart: $(VENV)/.installed
	$(BIN)/blockforge search searches/quickstart.yaml --out $(QUICKSTART_OUT) --resume=auto
	$(BIN)/blockforge export $(QUICKSTART_OUT) --cell depth=8 --out runs/quickstart-best-depth8 --force

test: $(VENV)/.installed
	$(BIN)/python -m pytest

test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest -m slow

clean:
	rm -rf $(VENV) runs
