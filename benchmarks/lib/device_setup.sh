# Sourced by benchmarks/lib/chain_run.sh (or by hand: `. benchmarks/lib/device_setup.sh`) on a GPU host of the
# device tool: the wheels carried under .whl/ (polars, jsonschema and their dependencies, which the GPU image lacks)
# installed beside the image's Python, and the GPU's identity printed with the results.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader

# Profile and parse workloads (benchmarks/cuda_replay.py: execution traces, NVML samples) into a work directory,
# PASSES passes each, logging to $OUT/LOG; prints the exit status.
profile_parse() {  # work-dir log-name passes workload...
  local work=$1 log=$2 passes=$3; shift 3
  timeout ${PROFILE_TIMEOUT:-300} python benchmarks/cuda_replay.py --workloads "$@" --device ${DEV:-H100} --policies insitu \
      --no-repeat --stages profile parse --profile-iterations $passes --work-dir $work --output $OUT/x > $OUT/$log 2>&1
  echo "profile+parse of $* ($passes passes) exit $?"
}
