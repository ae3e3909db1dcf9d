#!/bin/bash
# Issue 18, first measurement: the power state of a profiled workload and of its replay, per row (GPU host, via the
# device tool, which carries .whl/): DEV=H100 bash $0 Llama-3-70B
. benchmarks/device_setup.sh
python -c "import pynvml; print('pynvml', pynvml.__file__)"
model=$1; shift; DEV=${DEV:-H100}
W=/tmp/pw_$model
python benchmarks/cuda_database.py --output-dir /tmp/x --work-dir $W --model $model --device $DEV --stages profile parse "$@" 2>&1 | tail -3
grep -h "power state" $W/logs/*.log | head -3
D=$(ls -d $W/data/*/torch/*)
timeout 400 python scripts/replay.py --database-path $D --backend cuda --device $DEV --repeat-count 30 > $W/replay.log 2>&1; echo replay exit $?
grep "statuses" $W/replay.log | grep -v INFO | head -30
mkdir -p /tmp/o_$model && cp $D/*.csv $W/profile/power_samples.json $W/profile/workload.json /tmp/o_$model/ && cp $W/logs/*.log $W/replay.log /tmp/o_$model/
tar czf $OUT/$model.tar.gz -C /tmp o_$model
