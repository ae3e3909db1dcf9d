#!/bin/bash
# Issue 18: replay one NVML-sampled profile twice, --power-policy cooldown and match-clock, on the GPU host
# (run through the device tool, which carries .whl/ with polars and jsonschema): DEV=H100 bash $0 Llama-3-70B
. benchmarks/device_setup.sh
DEV=${DEV:-H100}; model=$1
W=/tmp/pw_$model
python benchmarks/cuda_database.py --output-dir /tmp/x --work-dir $W --model $model --device $DEV --stages profile parse 2>&1 | tail -2
D=$(ls -d $W/data/*/torch/*)
for policy in cooldown match-clock; do
  P=$W/$(basename $D)_${policy//-/}
  rm -rf $P && cp -r $D $P
  timeout 250 python scripts/replay.py --database-path $P --backend cuda --device $DEV --repeat-count 30 --power-policy $policy > $W/replay_$policy.log 2>&1; echo "$policy exit $?"
  python benchmarks/power_state.py $P --device $DEV --json $W/$policy.json | head -6
done
mkdir -p /tmp/o_$model && cp -r $W/*_cooldown $W/*_matchclock $W/*.json $W/replay_*.log $W/profile/power_samples.json /tmp/o_$model/
tar czf $OUT/power_policy_${DEV}_$model.tar.gz -C /tmp o_$model
