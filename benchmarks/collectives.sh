#!/usr/bin/env bash
# NCCL collective benchmarks on one multi-GPU host, as committed under benchmarks/results/comm/.
# Usage (repo root): bash benchmarks/collectives.sh OUT_DIR "2 4"
#   runs all four collectives, 1 KiB..512 MiB bf16, in event and kernel mode, one torchrun per (mode, op)
#   so a failure in one costs only that file; writes CSVs, logs and the machine's description to OUT_DIR.
set -u
out=${1:?output directory}; devices=${2:-"2"}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python=${PYTHON:-python3}
ngpu=$($python -c 'import torch; print(torch.cuda.device_count())')
mkdir -p "$out"
{
  date -u +"collected_at %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  nvidia-smi topo -m
  nvidia-smi nvlink -s 2>&1 | head -40
  $python - <<'PY'
import torch, platform
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count(),
      torch.cuda.get_device_name(0))
from opperf.comm.collectives import comm_version_dir
print("comm_version_dir", comm_version_dir("nccl"))
PY
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
} > "$out/environment.txt" 2>&1
for mode in event kernel; do
  for op in all_reduce all_gather reduce_scatter all_to_all; do
    mkdir -p "$out/$mode"
    $python -m torch.distributed.run --standalone --nproc-per-node "$ngpu" scripts/generate_comm_microbench.py \
      --do-run --backend nccl --device H200 --num-devices $devices --ops $op --dtype bfloat16 \
      --bytes-grid 1KiB..512MiB --bench-mode $mode --output-csv "$out/$mode/$op.csv" \
      > "$out/$mode/$op.log" 2>&1 || echo "FAILED: $mode $op (see $out/$mode/$op.log)"
    grep -E "INFO  opperf.comm: $op .*(1KiB|1MiB|512MiB) " "$out/$mode/$op.log" | sed "s/^/[$mode] /"
  done
done
