#!/bin/bash
# Issue 15/18: the small-kernel probe on held-out databases (qwen2-moe, olmoe: chosen on mistral/mixtral), then the
# mistral/mixtral transformers workloads profiled and parsed once and replayed under --power-policy cooldown and
# after-gemm (device tool, carrying .whl/ and probe_dbs/): bash benchmarks/after_gemm_run.sh
. benchmarks/device_setup.sh
if [ -z "${SKIP_PROBE:-}" ]; then
  timeout 150 python benchmarks/small_kernel_probe.py probe_dbs/hf_qwen2_moe_60x4/parsed/data/H100/torch/* \
      probe_dbs/hf_olmoe_64x8/parsed/data/H100/torch/* --variants insitu gemm gemm-small --output $OUT/small_heldout 2>&1 | tail -12
fi
W=/tmp/ag; rm -rf $W ${W}2; WORKLOADS=${WORKLOADS:-hf_mistral hf_mixtral_8x2}
timeout 120 python benchmarks/cuda_replay.py --workloads $WORKLOADS --device ${DEV:-H100} --policies insitu --no-repeat --stages profile parse \
    --work-dir $W --output $OUT/x > /tmp/ag_pp.log 2>&1; echo "profile+parse exit $?"
rm -rf ${W}2 && cp -r $W ${W}2
for pp in ${POWER_POLICIES:-cooldown after-gemm}; do
  dir=$W; [ $pp = after-gemm ] && dir=${W}2
  these=$WORKLOADS; [ $pp = after-gemm ] && these=${AG_WORKLOADS:-$WORKLOADS}
  timeout ${REPLAY_TIMEOUT:-150} python benchmarks/cuda_replay.py --workloads $these --device ${DEV:-H100} --policies insitu --no-repeat \
      --stages replay report --power-policy $pp --work-dir $dir --output $OUT/$pp > /tmp/ag_$pp.log 2>&1
  echo "$pp exit $?"; sed -n '/Per workload/,/^## Gap/p' $OUT/$pp/cuda_replay.md 2>/dev/null | head -8
done
cd /tmp && tar czf $OUT/databases.tar.gz $(find ag ag2 -type d -path '*/data/*/torch/*' -prune) ag_*.log 2>/dev/null
