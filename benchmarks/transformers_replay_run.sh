#!/bin/bash
# Issue 15: the transformers workloads of benchmarks/cuda_replay.py (profiled, parsed without workload.json,
# replayed from schemas and definitions) and the MoE routing probe, in one call of the device tool (which
# carries .whl/ with polars and jsonschema; the GPU image has torch and transformers):
#   bash benchmarks/transformers_replay_run.sh            -> $OUT/{moe_routing,part1,part2}, $OUT/databases.tar.gz
. benchmarks/device_setup.sh
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
if [ -z "${SKIP_PROBE:-}" ]; then
  timeout 170 python benchmarks/moe_routing_probe.py --output $OUT/moe_routing 2>&1 | tail -80; echo "probe exit ${PIPESTATUS[0]}"
fi
run_part() {  # name workloads...
  local part=$1; shift
  timeout ${PART_TIMEOUT:-190} python benchmarks/cuda_replay.py --workloads "$@" --policies insitu --no-repeat \
      --stages profile parse replay report --work-dir /tmp/$part --output $OUT/$part > /tmp/$part.log 2>&1
  echo "$part exit $?"; tail -3 /tmp/$part.log; cp /tmp/$part.log $OUT/$part/ 2>/dev/null
}
[ -z "${SKIP_PART1:-}" ] && run_part part1 hf_mistral hf_mixtral_8x2
[ -z "${SKIP_PART2:-}" ] && run_part part2 hf_qwen2_moe_60x4 hf_olmoe_64x8
cd /tmp && tar czf $OUT/databases.tar.gz $(find part1 part2 2>/dev/null -type d -path '*/data/*/torch/*' -prune) \
    $(find part1 part2 2>/dev/null -name 'trace_attribution.json' -o -name '*.log') 2>/dev/null; ls -la $OUT
