#!/bin/bash
# Two cache policies on the same parsed rows, on a GPU host of the device tool (.whl carried): every row of WORKLOADS
# replayed under each of POLICIES (default "insitu-inplace insitu"; benchmarks/cuda_replay.py --stages replay report,
# no new profile), from databases of earlier chains unpacked under $SRC/<workload>/insitu/data (e.g. a
# databases_recorded.tar.gz of benchmarks/results/). Packed into $OUT/cache_ab_<DEV>.tar.gz with the replay logs;
# `python benchmarks/cache_policy_ab.py DIR --policies …` compares them on the rows both replayed (a run cut off by
# the time limit included). One MoE workload with both policies takes ~100 s on an H200; DeepSeek-V2-Lite much more.
#   DEV=H100 SRC=.abwork/H100/iv WORKLOADS="hf_qwen2_moe_60x4 hf_deepseek_v2_lite" bash benchmarks/cache_policy_ab_run.sh
. benchmarks/device_setup.sh
DEV=${DEV:-H100}; W=/tmp/ab; RES=/tmp/abres; POLICIES=${POLICIES:-insitu-inplace insitu}
rm -rf $W $RES && mkdir -p $W $RES     # a warm machine keeps /tmp: no earlier call's report or databases packed again
for w in $WORKLOADS; do
  mkdir -p $W/$w/parsed && cp -r $SRC/$w/insitu/data $W/$w/parsed/
done
timeout ${REPLAY_TIMEOUT:-500} python benchmarks/cuda_replay.py --workloads $WORKLOADS --device $DEV \
    --policies $POLICIES --no-repeat --stages replay report --work-dir $W --output $RES \
    > $RES/replay.log 2>&1
echo "replay exit $?"; sed -n '/Issue 18/,/^## Gap/p' $RES/cuda_replay.md
(cd /tmp && tar czf $RES/databases.tar.gz $(for w in $WORKLOADS; do for p in $POLICIES; do echo ab/$w/$p/data; done
                                                                       echo ab/$w/replay_*.log; done))
tar czf $OUT/cache_ab_$DEV.tar.gz -C $RES .
