#!/bin/bash
# Issue 18: how steady the ground truth is. Each workload profiled and parsed in independent processes, one pass
# (twice) and PASSES passes (twice), then the PASSES-pass database replayed once and compared with every profile
# (benchmarks/profile_repeatability.py). Device tool, carrying .whl/, in two calls on the same warm machine:
#   PHASE=profile bash benchmarks/profile_repeatability_run.sh; PHASE=replay bash benchmarks/profile_repeatability_run.sh
. benchmarks/device_setup.sh
W=/tmp/pr; WORKLOADS=${WORKLOADS:-hf_mistral hf_phi3_mini hf_mixtral_8x2}; PASSES=${PASSES:-5}; DEV=${DEV:-H100}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-280}
profile() {  # run-name passes
  profile_parse $W/$1 profile_$1.log $2 $WORKLOADS
}
if [ "${PHASE:-profile}" = profile ]; then
  profile one 1; profile one_b 1; profile five $PASSES
else
  [ -n "${SECOND_FIVE:-1}" ] && profile five_b $PASSES
  timeout ${REPLAY_TIMEOUT:-300} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV --policies insitu \
      --no-repeat --stages replay report --work-dir $W/five --output $OUT/replay_five > $OUT/replay_five.log 2>&1
  echo "replay exit $?"; sed -n '/Per workload/,/^## Gap/p' $OUT/replay_five/cuda_replay.md | head -9
  for w in $WORKLOADS; do
    dbs=""; for r in one one_b five five_b; do d=$(ls -d $W/$r/$w/parsed/data/*/torch/* 2>/dev/null) && dbs="$dbs $r=$d"; done
    python benchmarks/profile_repeatability.py --databases $dbs --replayed five=$(ls -d $W/five/$w/insitu/data/*/torch/*) \
        --output $OUT/$w | head -9
  done
  cd /tmp && tar czf $OUT/databases.tar.gz $(find pr -type d -path '*/data/*/torch/*' -prune)
fi
