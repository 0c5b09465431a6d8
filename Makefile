# Two commands, from a fresh clone, with no GPU:
#   make book   build the website into _build/html (warnings are errors)
#   make test   unit tests + strict nbval over every chapter + the same from the installed wheel on an older
#               CPU feature set + the wheel installed from the package index (install-test)
#               + the site rendered in headless Chromium
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
VENDOR := _vendor/.stamp
CHAPTERS := $(wildcard chapters/*.ipynb)
APPENDIX := $(wildcard appendix/*.ipynb)

.PHONY: book test unit notebooks wheel-test site-test execute clean dist install-test

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# MathJax, the Jupyter widget manager and anywidget's front end (the book's offline explorables)
# are vendored from npm so that pages render with no network.
$(VENDOR): package.json package-lock.json
	npm ci --no-audit --no-fund --silent
	rm -rf _vendor && mkdir -p _vendor/widgets
	cp -r node_modules/mathjax/es5 _vendor/mathjax
	cp -r node_modules/@jupyter-widgets/html-manager/dist/. _vendor/widgets/
	cp node_modules/requirejs/require.js _vendor/widgets/require.js
	mkdir -p _vendor/anywidget && cp node_modules/anywidget/dist/index.js _vendor/anywidget/index.js
	touch $(VENDOR)

book: $(STAMP) $(VENDOR)
	$(VENV)/bin/jupyter-book build . --warningiserror --nitpick --keep-going

# two worker processes (pytest-xdist): the interpreter-run kernel tests are CPU-bound, and CI has two cores
unit: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

notebooks: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --nbval intro.ipynb chapters appendix --nbval-sanitize-with nbval_sanitize.cfg --nbval-current-env --nbval-cell-timeout=180 -p no:cacheprovider

# Every chapter run from the installed wheel, in a folder outside the clone, under strict nbval with NumPy's
# AVX-512/AVX2/FMA3/F16C paths switched off: the stored outputs checked on a second set of CPU features.
wheel-test: $(STAMP)
	$(PY) tools/run_from_wheel.py $(CHAPTERS) $(APPENDIX)

site-test: book
	$(PY) -m pytest -q -m site tests/test_site.py

test: unit notebooks wheel-test site-test install-test

# Re-execute every chapter in place after changing code they import (outputs are committed).
execute: $(STAMP)
	$(PY) tools/execute_notebooks.py intro.ipynb $(CHAPTERS) $(APPENDIX)

# A wheel with the checkpoints and recorded results inside (for Colab or a bare GPU box): dist/*.whl.
# Built by pip in a venv of its own (pip fetches setuptools into an isolated build environment), not in the
# 2 GB book environment; tests/test_packaging.py checks what the wheel holds. The recorded results are
# committed once, in benchmarks/results/: the build copies them into minillm/results/ (package data, git-ignored)
# and removes the copy after.
DIST_VENV := build/dist-venv
dist:
	rm -rf dist build minillm/results && $(PYTHON) -m venv $(DIST_VENV)
	mkdir -p minillm/results && cp benchmarks/results/*.json minillm/results/
	$(DIST_VENV)/bin/python -m pip wheel -q --no-deps -w dist . ; status=$$?; rm -rf minillm/results; exit $$status

# Installs the wheel into a fresh venv as the README tells a pip user without a GPU (torch, then
# minillm[cpu,notebook] from the package index) and runs a kernel in Triton's interpreter (needs the network).
install-test: $(STAMP)
	$(PY) -m pytest -q -m install tests/test_packaging.py -p no:cacheprovider

clean:
	rm -rf _build _vendor
