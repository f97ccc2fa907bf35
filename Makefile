# flashlab — the doors a reader walks through.
#   make book         create .venv, install, render the site (the student's book), print where to open it
#   make book-instructor  the same site with every exercise's solution and hidden tests, in build/site-instructor
#   make test         import contract, unit, property, kernel, notebook (nbval), site and assignment tests
#   make lab          JupyterLab on notebooks/
#   make figures      regenerate figures/ from flashlab.course.figures
#   make assignments  student versions of the exercises (solutions stripped) in build/assignments
#   make grade        grade SUBMISSIONS=<folder> (<student>/<chapter>.ipynb) into build/grades.csv
#   make bench        GPU benchmarks into results/ (needs a CUDA GPU)
#   make notebooks    re-execute every notebook in place (after changing the package)

PYTHON     ?= python3
VENV       ?= .venv
PY         := $(VENV)/bin/python
# pip takes the CPU build of this torch from the local disk; on a CUDA machine set
# TORCH_SPEC to your build (e.g. TORCH_SPEC='torch==2.11.0') or to '' to keep the installed one.
TORCH_SPEC ?= torch==2.13.0
STAMP      := $(VENV)/.flashlab-installed
# make grade: SUBMISSIONS holds one folder per student with <chapter>.ipynb (or nbgrader's
# <chapter>/<chapter>.ipynb); the scores go to GRADES, one row per student and exercise.
SUBMISSIONS ?=
GRADES      ?= build/grades.csv
GRADE_FLAGS ?=

.PHONY: book book-instructor test lab figures assignments grade grade-needs-submissions bench notebooks install chromium bubblewrap clean help
.DEFAULT_GOAL := help

help:
	@sed -n '2,11p' Makefile | sed 's/^#//'

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when pyproject.toml changes (or the venv is new).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(PY) -m pip install --quiet "$(TORCH_SPEC)"; fi
	$(PY) -m pip install --quiet -e ".[book,test]"
	@touch $@

install: $(STAMP)

# The Triton the lent Hopper GPUs run (3.6), installed beside the venv's: the tests that compile
# the Gluon kernels for sm_90 on a CPU (tests/tiers.py, sm90_build_env) read the machine code the
# GPU will run, whose register allocation can differ from the venv's Triton.
SM90_TRITON ?= triton==3.6.0
SM90_DIR    := $(VENV)/triton-sm90
$(SM90_DIR)/.installed: | $(PY)
	$(PY) -m pip install --quiet --no-deps --target $(SM90_DIR) "$(SM90_TRITON)"
	@touch $@

# Headless Chromium for the site test (Debian package); installed only if missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the site test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# bubblewrap: the sandbox every submission is graded in (Debian package); installed only if missing.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { \
	  echo "installing Debian's bubblewrap for the grader's sandbox"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }

# The public site: exercises as the student gets them (no solutions, no hidden tests), in build/site.
book: $(STAMP)
	$(PY) -m flashlab.course.site build

# For instructors only: the notebooks as committed, solutions and hidden tests shown.
book-instructor: $(STAMP)
	$(PY) -m flashlab.course.site build --instructor

test: $(STAMP) $(SM90_DIR)/.installed chromium bubblewrap
	$(VENV)/bin/lint-imports
	$(PY) -m pytest tests
	$(PY) -m pytest --nbval notebooks --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

figures: $(STAMP)
	$(PY) -m flashlab.course.figures figures

assignments: $(STAMP)
	$(PY) -m flashlab.course.assignments build/assignments

# Checked before the install, so a forgotten argument fails at once.
# Each notebook runs in its own bubblewrap sandbox; GRADE_FLAGS passes more options
# (e.g. --student NAME, --chapter NAME; see `python -m flashlab.course.assignments grade -h`).
grade: $(if $(SUBMISSIONS),$(STAMP) bubblewrap,grade-needs-submissions)
	$(PY) -m flashlab.course.assignments grade "$(SUBMISSIONS)" --out "$(GRADES)" $(GRADE_FLAGS)

grade-needs-submissions:
	@echo "make grade needs the folder of submissions: make grade SUBMISSIONS=<folder>" >&2
	@echo "  <folder>/<student>/<chapter>.ipynb, e.g. submissions/alice/02_online_softmax.ipynb" >&2
	@echo "  (nbgrader's <folder>/<student>/<chapter>/<chapter>.ipynb works too); scores go to GRADES=$(GRADES)" >&2
	@exit 2

bench: $(STAMP)
	$(PY) -m flashlab.lab.bench --out results

notebooks: $(STAMP)
	for nb in notebooks/*.ipynb; do $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace "$$nb" || exit 1; done

clean:
	rm -rf build book/_build
