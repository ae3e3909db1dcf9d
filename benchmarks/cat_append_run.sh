#!/bin/bash
# Issue 15: the cat rows of the hf_mistral / hf_mixtral_8x2 databases (parsed by benchmarks/after_gemm_run.sh),
# copied to probe_cat/<workload>/torch2.11.0_cuda13.0/, replayed alone with the append rule of
# opperf/replay/hooks/torch_tensor_list.py (device tool, carrying the jsonschema wheels).
. benchmarks/device_setup.sh
for w in hf_mistral hf_mixtral_8x2; do
  timeout 200 python scripts/replay.py --database-path probe_cat/$w/torch2.11.0_cuda13.0 --backend cuda --device H100 --repeat-count 30 > /tmp/cat_$w.log 2>&1; echo "$w exit $?"; tail -2 /tmp/cat_$w.log
  python - <<PY
import csv
for r in csv.DictReader(open("probe_cat/$w/torch2.11.0_cuda13.0/cat.csv")):
    p, x = float(r["Profiling Average Duration(us)"]), float(r["Average Duration(us)"] or "nan")
    print(f"{r['Input Shapes']:<40} {p:9.2f} {x:9.2f} {x/p:6.3f} {'cold' if 'cold' in r.get('Replay L2 Policy','') else ''}")
PY
  mkdir -p $OUT/$w && cp probe_cat/$w/torch2.11.0_cuda13.0/cat.csv $OUT/$w/
done
