# Sourced on a GPU host of the device tool (`. benchmarks/lib/device_workflow_setup.sh`, carry: [".dev"]) to run the
# workflow itself there (benchmarks/e2e_prediction.py --stages workflow). The GPU image has torch and transformers,
# not Snakemake or polars. .dev/ (git-ignored) carries polars' runtime as an xz tarball of its wheel's contents (the
# 54 MB wheel and the checkout exceed the 64 MiB transfer; xz makes it 33 MB) and, in .dev/wheels/, the wheels of
# polars, jsonschema and Snakemake 9 with its dependencies for the image's Python (cp312) without pulp (Snakemake's
# ILP scheduler, 16 MB: the benchmark runs the greedy one). Made on the host with
#   pip wheel snakemake==9.27.1 -w W   (then `pip download --python-version 3.12 --only-binary=:all:` of its
#   compiled dependencies) and  unzip polars_runtime_32-*.whl -d R && tar cJf polars_runtime_32.tar.xz -C R .
mkdir -p /tmp/site
[ -d /tmp/site/polars_runtime_32 ] || tar xJf .dev/polars_runtime_32.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .dev/wheels/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
command -v python >/dev/null || { mkdir -p /tmp/site/bin && ln -sf "$(command -v python3)" /tmp/site/bin/python; }
python -c "import torch, transformers, snakemake, polars; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'snakemake', snakemake.__version__, 'polars', polars.__version__)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
