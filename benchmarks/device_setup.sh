# Sourced by the *_run.sh scripts on a GPU host of the device tool: the wheels carried under .whl/ (polars,
# jsonschema and their dependencies, which the GPU image lacks) installed beside the image's Python, and the
# GPU's identity printed with the results.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
