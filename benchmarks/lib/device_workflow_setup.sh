# Sourced on a GPU host of the device tool (`. benchmarks/lib/device_workflow_setup.sh`, carry: [".dev"]) to run the
# workflow itself there (benchmarks/e2e_prediction.py --stages workflow). The GPU image has torch and transformers,
# not Snakemake or polars. .dev/ (git-ignored) carries polars' runtime as an xz tarball of its wheel's contents (the
# 54 MB wheel and the checkout exceed the 64 MiB transfer; xz makes it 33 MB) and, in .dev/wheels/, the wheels of
# polars, jsonschema and Snakemake 9 with its dependencies for the image's Python (cp312) without pulp (Snakemake's
# ILP scheduler, 16 MB: the benchmark runs the greedy one), with msmodeling's Python dependencies (the `msmodeling`
# extra: optree, strenum, aenum, overrides, colorama, prettytable, loguru, diffusers, compressed-tensors), and
# msmodeling's checkout in .dev/msmodeling (the grid records the model's queries with its runner, the check and the
# predictions ask it). Made on the host with
#   pip wheel snakemake==9.27.1 polars jsonschema optree strenum aenum overrides colorama prettytable loguru -w W
#   (then `pip download --python-version 3.12 --only-binary=:all: --no-deps` of its compiled dependencies and of
#   diffusers, compressed-tensors), unzip polars_runtime_32-*.whl -d R && strip --strip-unneeded R/*/*.so &&
#   tar cJf polars_runtime_32.tar.xz -C R .   and  cp -r ../shared/msmodeling .dev/msmodeling  (62 MiB with the
#   checkout, under the 64 MiB transfer).
mkdir -p /tmp/site
[ -d /tmp/site/polars_runtime_32 ] || tar xJf .dev/polars_runtime_32.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .dev/wheels/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
[ -d .dev/msmodeling ] && export OPPERF_MSMODELING_DIR=$PWD/.dev/msmodeling
command -v python >/dev/null || { mkdir -p /tmp/site/bin && ln -sf "$(command -v python3)" /tmp/site/bin/python; }
python -c "import torch, transformers, snakemake, polars; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'snakemake', snakemake.__version__, 'polars', polars.__version__)"
[ -n "${OPPERF_MSMODELING_DIR:-}" ] && PYTHONPATH=$PYTHONPATH:$OPPERF_MSMODELING_DIR python -c \
    "import tensor_cast.core.model_runner; print('msmodeling runner imports')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
