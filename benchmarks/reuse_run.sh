#!/bin/bash
# Issue 18: replay with each input's L2 residency from the workload's own reuse distances (the execution trace
# recorded beside each profile, opperf.parse.reuse), on the device tool carrying .whl/:
#   DEV=H100 WORKLOADS="hf_mistral hf_phi3_mini" PASSES=5 bash benchmarks/reuse_run.sh
. benchmarks/device_setup.sh
W=/tmp/reuse; WORKLOADS=${WORKLOADS:-hf_mistral hf_phi3_mini hf_mixtral_8x2}; DEV=${DEV:-H100}
timeout ${PROFILE_TIMEOUT:-300} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV --policies insitu \
    --no-repeat --stages profile parse --profile-iterations ${PASSES:-5} --work-dir $W --output $OUT/x > $OUT/profile.log 2>&1
echo "profile+parse exit $?"; grep -h "reuse distances" $W/*/parse.log | sed 's/.*trace.json: //'
timeout ${REPLAY_TIMEOUT:-280} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV --policies insitu \
    --no-repeat --stages replay report --work-dir $W --output $OUT/replay > $OUT/replay.log 2>&1
echo "replay exit $?"; sed -n '/Per workload/,/^## Gap/p' $OUT/replay/cuda_replay.md | head -9
cd /tmp && tar czf $OUT/databases.tar.gz $(find reuse -type d -path '*/data/*/torch/*' -prune) reuse/*/*.log
