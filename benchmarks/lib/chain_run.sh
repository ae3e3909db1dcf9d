#!/bin/bash
# Whole replay chains on a GPU host of the device tool (.whl carried): profile, parse, replay (twice with REPEAT),
# stage 4b with PHASE, each workload reported by benchmarks/cuda_replay.py; the results behind replay_gates.py
# (benchmarks/results/unseen_gates/, dev_gates_reuse/, whole_order/). Until issue 42 it was
# benchmarks/input_values_ab_run.sh: it first compared the workload's recorded input values (MoE splits, masks,
# distinct indices: opperf.input_values) with replay's own draw, which VARIANTS=balanced and TYPES still do.
# Steps, each optional:
#   1. profile and parse WORKLOADS (PASSES passes each, input_values.json recorded beside each trace) into /tmp/iv,
#      unless SKIP_PROFILE is set (a later call on the same warm machine);
#   2. with TYPES (e.g. "_grouped_mm histc bincount", "masked_fill_", "index _index_put_impl_"): only those kernel
#      types, replayed three times each from the
#      same parsed rows (scripts/replay.py): recorded (seeds 0 and 1) and balanced (the column removed), into
#      types/<workload>/<run>_<type>.csv; its table was made by
#      benchmarks/input_values_ab.py (git show 154a3bc:benchmarks/input_values_ab.py);
#   3. the whole chain (benchmarks/cuda_replay.py, default policies) for each of VARIANTS (default "recorded
#      balanced"; none when TYPES is set): `recorded` from the parsed databases as they are, `balanced` after
#      removing the column from them (so run it last), into <variant>/ and databases_<variant>.tar.gz; with
#      REPEAT set, each replayed twice (another seed) for issue 18's repeatability; RUNS (e.g. "insitu", then
#      "insitu-repeat" with SKIP_PROFILE in the next call) splits the two replays of a workload too long for one call;
#      HEATER_MIN_POWER (W) passes --heater-min-power (benchmarks/results/heater_ab/). The power state is after-gemm,
#      the one replay keeps since b6b197b (issue 42): a POWER_POLICY still set stops the script before it starts.
#      PHASE=1 then runs stage 4b (scripts/phase_replay.py, folded into the same replays; PHASE_ITERATIONS passes
#      --phase-iterations, PHASE_COLD_COPIES=1 --phase-cold-copies) and reports it apart in
#      <variant>_phase/. TAG is appended to the packed file's name, so that several calls in one device command keep theirs.
# Everything lands under $RES (default /tmp/ivres) and is packed into $OUT/input_values_<DEV>.tar.gz at the end
# (the device tool returns a few files, not a tree). The device tool's 10-minute limit fits steps 1+3 for one
# variant of three MoE workloads; run the other variant with SKIP_PROFILE in the next call:
#   DEV=H200 VARIANTS=recorded bash benchmarks/lib/chain_run.sh
#   DEV=H200 SKIP_PROFILE=1 TYPES="_grouped_mm histc" VARIANTS=balanced bash benchmarks/lib/chain_run.sh
if [ -n "${POWER_POLICY:-}" ]; then
  echo "chain_run.sh: POWER_POLICY=$POWER_POLICY: replay has one power state, after-gemm (--power-policy went in" \
       "b6b197b, issue 42); unset POWER_POLICY" >&2
  exit 2
fi
. benchmarks/lib/device_setup.sh
W=/tmp/iv; DEV=${DEV:-H100}; RES=${RES:-/tmp/ivres}
rm -rf $RES && mkdir -p $RES     # W stays for SKIP_PROFILE; RES holds only this call's results (no stale report packed)
WORKLOADS=${WORKLOADS:-hf_olmoe_64x8 hf_qwen2_moe_60x4 hf_mixtral_8x2}
VARIANTS=${VARIANTS-$([ -n "${TYPES:-}" ] || echo recorded balanced)}
COLUMN="Profiling Input Values"

without_values() {  # in-csv out-csv: the rows without the recorded values
  python3 - "$1" "$2" "$COLUMN" <<'PY'
import csv, sys
with open(sys.argv[1], newline="") as handle:
    rows = list(csv.DictReader(handle))
names = [name for name in (rows[0] if rows else []) if name != sys.argv[3]]
with open(sys.argv[2], "w", newline="") as handle:
    writer = csv.DictWriter(handle, fieldnames=names, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
PY
}

if [ -z "${SKIP_PROFILE:-}" ]; then
  OUT=$RES profile_parse $W profile.log ${PASSES:-5} $WORKLOADS
fi
for t in ${TYPES:-}; do
  for w in $WORKLOADS; do
    rows=$(ls $W/$w/parsed/data/$DEV/torch/*/$t.csv 2>/dev/null | head -1); [ -n "$rows" ] || continue
    version=$(basename $(dirname $rows)); mkdir -p $RES/types/$w
    grep -q "$COLUMN" $rows && without_values $rows $W/$w/balanced_$t.csv || cp $rows $W/$w/balanced_$t.csv
    for run in recorded:0 recorded_seed1:1 balanced:0; do
      name=${run%%:*}; source=$rows; [ $name = balanced ] && source=$W/$w/balanced_$t.csv
      python scripts/replay.py --rows $source --kernel $t --backend cuda --version-dir $version \
          --seed ${run##*:} --output $RES/types/$w/${name}_$t.csv >> $RES/types/$w/replay.log 2>&1
      echo "$w $t $name: exit $?"
    done
  done
done
for variant in $VARIANTS; do
  if [ $variant = balanced ]; then
    for path in $(grep -l "$COLUMN" $W/*/parsed/data/$DEV/torch/*/*.csv 2>/dev/null); do
      without_values $path $path.tmp && mv $path.tmp $path && echo "balanced: $path"
    done
  fi
  timeout ${REPLAY_TIMEOUT:-400} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV --policies insitu \
      $([ -n "${REPEAT:-}" ] && echo --repeat || echo --no-repeat) $([ -n "${RUNS:-}" ] && echo --replay-runs $RUNS) \
      $([ -n "${HEATER_MIN_POWER:-}" ] && echo --heater-min-power $HEATER_MIN_POWER) \
      --stages replay report --work-dir $W --output $RES/$variant > $RES/replay_$variant.log 2>&1
  echo "$variant: replay exit $?"; sed -n '/Per workload/,/^## Gap/p' $RES/$variant/cuda_replay.md | head -7
  if [ -n "${PHASE:-}" ]; then   # stage 4b on the same replays, reported apart (<variant>_phase/)
    timeout ${PHASE_TIMEOUT:-200} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV \
        --policies insitu $([ -n "${REPEAT:-}" ] && echo --repeat || echo --no-repeat) \
        $([ -n "${RUNS:-}" ] && echo --replay-runs $RUNS) $([ -n "${PHASE_ITERATIONS:-}" ] && echo \
        --phase-iterations $PHASE_ITERATIONS) \
        $([ -n "${PHASE_COLD_COPIES:-}" ] && echo --phase-cold-copies) --stages phase report --work-dir $W \
        --output $RES/${variant}_phase > $RES/phase_$variant.log 2>&1
    echo "$variant + phase: exit $?"; sed -n '/Per workload/,/^## Gap/p' $RES/${variant}_phase/cuda_replay.md | head -7
    grep -h "phase replay (stage 4b)" $RES/${variant}_phase/cuda_replay.md
    for w in $WORKLOADS; do    # the stage's table and log of each replay it ran on in this call (RUNS)
      for run in ${RUNS:-insitu insitu-repeat}; do
        [ -f $W/$w/phase_$run.log ] || continue
        suffix=$([ $run = insitu ] || echo _$run)
        cp $W/$w/$run/phase_replay.csv $RES/phase_replay_$w$suffix.csv; cp $W/$w/phase_$run.log $RES/phase_$w$suffix.log
        grep -hE "phase|applied" $W/$w/phase_$run.log | grep -v -e USDT -e progress
      done
    done
  fi
  (cd /tmp && tar czf $RES/databases_$variant.tar.gz $(for w in $WORKLOADS; do echo iv/$w/insitu/data; done))
done
tar czf $OUT/input_values_$DEV${TAG:-}.tar.gz -C $RES .
