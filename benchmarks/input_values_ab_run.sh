#!/bin/bash
# The workload's recorded input values (MoE splits, opperf.input_values) against replay's balanced draw, on the same
# profiles. Profile and parse WORKLOADS (PASSES passes each, input_values.json recorded beside each trace), replay
# and report them (benchmarks/cuda_replay.py, default policies) from the parsed databases as they are ("recorded"),
# then once more with the `Profiling Input Values` column removed ("balanced"), keeping both replayed databases:
#   DEV=H100 WORKLOADS="hf_olmoe_64x8 hf_qwen2_moe_60x4 hf_mixtral_8x2" bash benchmarks/input_values_ab_run.sh
# With TYPES="_grouped_mm histc bincount", only those kernel types are replayed (scripts/replay.py, per type), three
# times each from the same parsed rows: recorded (seeds 0 and 1) and balanced.
. benchmarks/device_setup.sh
W=/tmp/iv; DEV=${DEV:-H100}; WORKLOADS=${WORKLOADS:-hf_olmoe_64x8 hf_qwen2_moe_60x4 hf_mixtral_8x2}
if [ -z "${SKIP_PROFILE:-}" ]; then
  profile_parse $W profile.log ${PASSES:-5} $WORKLOADS
fi
if [ -n "${TYPES:-}" ]; then
  # Only the kernel types whose rows carry recorded values, each replayed three times from the same parsed rows:
  # recorded (seeds 0 and 1: replay's own noise) and balanced (seed 0).
  for w in $WORKLOADS; do
    for t in $TYPES; do
      rows=$(ls $W/$w/parsed/data/$DEV/torch/*/$t.csv 2>/dev/null | head -1); [ -n "$rows" ] || continue
      version=$(basename $(dirname $rows)); mkdir -p $OUT/types/$w
      python3 - $rows $W/$w/balanced_$t.csv <<'PY'
import csv, sys
with open(sys.argv[1], newline="") as handle:
    rows = list(csv.DictReader(handle))
names = [name for name in rows[0] if name != "Profiling Input Values"]
with open(sys.argv[2], "w", newline="") as handle:
    writer = csv.DictWriter(handle, fieldnames=names, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
PY
      for run in recorded:0 recorded_seed1:1 balanced:0; do
        name=${run%%:*}; source=$rows; [ $name = balanced ] && source=$W/$w/balanced_$t.csv
        python scripts/replay.py --rows $source --kernel $t --backend cuda --version-dir $version \
            --seed ${run##*:} --output $OUT/types/$w/${name}_$t.csv >> $OUT/types/$w/replay.log 2>&1
        echo "$w $t $name: exit $?"
      done
    done
  done
  exit 0
fi
for variant in recorded balanced; do
  if [ $variant = balanced ]; then
    python3 - $W <<'PY'
import csv, pathlib, sys
column = "Profiling Input Values"
for path in pathlib.Path(sys.argv[1]).glob("*/parsed/data/**/*.csv"):
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if rows and column in rows[0]:
        names = [name for name in rows[0] if name != column]
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=names, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        print("balanced:", path.name, len(rows), "rows without", column)
PY
  fi
  timeout ${REPLAY_TIMEOUT:-280} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV --policies insitu \
      --no-repeat --stages replay report --work-dir $W --output $OUT/$variant > $OUT/replay_$variant.log 2>&1
  echo "$variant: replay exit $?"; sed -n '/Per workload/,/^## Gap/p' $OUT/$variant/cuda_replay.md | head -7
  (cd /tmp && tar czf $OUT/databases_$variant.tar.gz $(for w in $WORKLOADS; do echo iv/$w/insitu/data; done))
done
