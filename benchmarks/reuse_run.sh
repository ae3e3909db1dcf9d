#!/bin/bash
# Issue 18: replay with each input's L2 residency from the workload's own reuse distances (the execution trace
# recorded beside each profile, opperf.parse.reuse), on the device tool carrying .whl/. Profile and parse
# PROFILE_WORKLOADS (PASSES passes each), then replay and report REPLAY_WORKLOADS from the same work directory (a
# later call on the warm machine can replay the rest):
#   DEV=H200 PROFILE_WORKLOADS="hf_mistral hf_phi3_mini" REPLAY_WORKLOADS="hf_mistral" bash benchmarks/reuse_run.sh
. benchmarks/device_setup.sh
W=/tmp/reuse; DEV=${DEV:-H100}
if [ -n "${PROFILE_WORKLOADS:-}" ]; then
  profile_parse $W profile.log ${PASSES:-5} $PROFILE_WORKLOADS
  grep -h "reuse distances" $W/*/parse.log | sed 's/.*trace.json: //'
fi
if [ -n "${REPLAY_WORKLOADS:-}" ]; then
  tag=$(echo $REPLAY_WORKLOADS | tr ' ' '_')
  timeout ${REPLAY_TIMEOUT:-280} python benchmarks/cuda_replay.py --workloads $REPLAY_WORKLOADS --device $DEV --policies insitu \
      --no-repeat --stages replay report --work-dir $W --output $OUT/$tag > $OUT/replay_$tag.log 2>&1
  echo "replay exit $?"; sed -n '/Per workload/,/^## Gap/p' $OUT/$tag/cuda_replay.md | head -9
  cd /tmp && tar czf $OUT/databases_$tag.tar.gz $(for w in $REPLAY_WORKLOADS; do find reuse/$w -type d -path '*/data/*/torch/*' -prune; done) \
      $(for w in $REPLAY_WORKLOADS; do ls reuse/$w/*.log; done)
fi
