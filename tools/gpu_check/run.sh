#!/usr/bin/env bash
# The GPU check, on the lent GPU machine (JAX, no TensorFlow, Keras, KerasHub or MLflow; no network), from the
# repository root, with the bundle `make gpu-check-bundle` wrote here carried beside it:
#   run(command="bash tools/gpu_check/run.sh", carry=["gpu_check"], timeout_s=540)
# Installs the bundle's wheels into /tmp/site, then runs `python -m lab gpu-check` on Keras' JAX backend:
# summary.md, comparison.{md,json,png} and mlflow.db land in $OUT (or the folder given as $1).
# SET='compare.seeds=[1,2,3]' (any config key) changes the run; PYTHON=... another interpreter.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-reports/gpu_check}}"
python="${PYTHON:-python3}"
bundle="${BUNDLE:-gpu_check}"
if [ -d "$bundle/wheels" ] && [ -n "$(ls "$bundle/wheels")" ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$bundle"/wheels/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND="${KERAS_BACKEND:-jax}" PYTHONUNBUFFERED=1
export MLFLOW_DISABLE_TELEMETRY=true PIPELINE_QUIET=1
sets=()
for setting in ${SET:-}; do sets+=(--set "$setting"); done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec "$python" -m lab gpu-check --bundle "$bundle" --out "$out" "${sets[@]}"
