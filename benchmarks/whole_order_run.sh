#!/bin/bash
# The whole trace replayed in the workload's order (benchmarks/phase_replay.py with no shape prefixes: every call of
# every pass, once, back to back), with and without each call's warm inputs rewritten into L2 before it
# (--warm-inputs), against the one-at-a-time replay of the same rows, on a GPU host of the device tool (.whl
# carried). Steps:
#   1. the chain of benchmarks/input_values_ab_run.sh for WORKLOADS (profile 5 passes, parse, one replay with the
#      default policies), unless SKIP_CHAIN is set (a later call on the same warm machine);
#   2. for each workload and each of MODES ("warm plain"; "copies": warm inputs and --cold-copies), the whole trace in
#      order into whole_<mode>_<w>.json.
# Results land in $OUT beside the chain's input_values_<DEV><TAG>.tar.gz (its databases, for the recomputation):
#   DEV=H200 WORKLOADS="dense hf_mixtral_8x2" bash benchmarks/whole_order_run.sh
# then `python benchmarks/whole_order_gaps.py` over the JSONs and the databases (issue 18's figures).
set -u
DEV=${DEV:-H100}; W=/tmp/iv; WORKLOADS=${WORKLOADS:-dense hf_mixtral_8x2}
if [ -z "${SKIP_CHAIN:-}" ]; then
  VARIANTS=recorded WORKLOADS="$WORKLOADS" DEV=$DEV bash benchmarks/input_values_ab_run.sh
fi
. benchmarks/device_setup.sh > /dev/null
for mode in ${MODES:-warm plain}; do
  for w in $WORKLOADS; do
    rows=$(ls -d $W/$w/insitu/data/$DEV/torch/*/ | head -1)
    timeout ${WHOLE_TIMEOUT:-150} python benchmarks/phase_replay.py --trace $W/$w/profile/trace.json --rows $rows \
        --shapes $(case $mode in warm) echo --warm-inputs;; copies) echo --warm-inputs --cold-copies;; esac) \
        --output $OUT/whole_${mode}_$w.json \
        > $OUT/whole_${mode}_$w.log 2>&1
    echo "whole trace in order, $mode, $w: exit $?"; tail -2 $OUT/whole_${mode}_$w.log
  done
done
