#!/bin/bash
# Issue 18: the power policies compared on the same profiles. Profile and parse WORKLOADS (PASSES passes each,
# NVML-sampled), then replay them once per policy in POLICIES from the same parsed databases and report each
# (benchmarks/cuda_replay.py), keeping every replayed database:
#   DEV=H100 WORKLOADS="dense hf_mixtral_8x2" POLICIES="after-gemm match-clock" bash benchmarks/power_policy_ab_run.sh
. benchmarks/device_setup.sh
W=/tmp/ab; DEV=${DEV:-H100}; WORKLOADS=${WORKLOADS:-dense hf_mixtral_8x2}
if [ -z "${SKIP_PROFILE:-}" ]; then
  profile_parse $W profile.log ${PASSES:-5} $WORKLOADS
fi
for policy in ${POLICIES:-after-gemm match-clock}; do
  timeout ${REPLAY_TIMEOUT:-280} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV --policies insitu \
      --no-repeat --stages replay report --power-policy $policy --work-dir $W --output $OUT/$policy > $OUT/replay_$policy.log 2>&1
  echo "$policy: replay exit $?"; sed -n '/Per workload/,/^## Gap/p' $OUT/$policy/cuda_replay.md | head -6
  (cd /tmp && tar czf $OUT/databases_$policy.tar.gz $(for w in $WORKLOADS; do echo ab/$w/insitu/data; done))
done
