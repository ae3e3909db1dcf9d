"""Probe (issue 51): ask msmodeling's own ProfilingDataSource / InterpolatingDataSource about hand-laid rows for
TensorCast's ops (tensor_cast.attention, reshape_and_cache, the rotary index_select / cat), to fix the rows the
grid must lay for them. Findings: docs/msmodeling.md, "What its runtime reads". Leaves once the grid lays those
rows and tests ask msmodeling about them.

    OPPERF_MSMODELING_PYTHON benchmarks/probes/msmodeling_attention_contract.py MSMODELING_DIR [WORK_DIR]
"""
import csv
import json
import os
import shutil
import sys
import tempfile
sys.path.insert(0, sys.argv[1])
import logging
logging.disable(logging.WARNING)
import torch
import tensor_cast.ops  # noqa: F401
from tensor_cast.performance_model.op_invoke_info import OpInvokeInfo
from tensor_cast.performance_model.profiling_database import InterpolatingDataSource, ProfilingDataSource, QuerySource

DB = os.path.join(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(), "db")
shutil.rmtree(DB, ignore_errors=True)
os.makedirs(DB)
open(f"{DB}/op_mapping.yaml", "w").write("""\
operator_mappings:
  "tensor_cast.attention.default":
    kernel_type: PagedAttention
    query_mode: attention_special
  "tensor_cast.reshape_and_cache.default":
    kernel_type: ReshapeAndCache
  "aten.index_select.default":
    kernel_type: IndexSelect
  "aten.cat.default":
    kernel_type: Cat
  "aten.mm.default":
    kernel_type: NoLayout
    query_mode: attention_special
  "aten.bmm.default":
    kernel_type: NoBatch
    query_mode: attention_special
  "aten.addmm.default":
    kernel_type: Unique
    query_mode: attention_special
  "aten.add.Tensor":
    kernel_type: ReshapeAndCacheNdKernel
query_selection_policy:
  kernel_overrides:
    Unique: {require_semantic_unique: true}
""")
ATT_HEADER = ["Input Shapes", "Input Data Types", "Input Formats", "Runtime avg_seq_len", "Runtime sparse_mode",
              "Runtime num_key_value_heads", "Runtime input_layout", "Runtime batch_size", "Average Duration(us)"]
def att_row(B, T, ctx, lat, blocks=17, dtype="DT_BF16", q2d=True):
    q = f"{T},64" if q2d else f"{T},4,16"
    shapes = f"{q};{blocks},128,2,16;{blocks},128,2,16;{B},{-(-ctx // 128)};{B + 1};{B};{B}"
    return [shapes, ";".join([dtype] * 3 + ["INT64"] * 4), ";".join(["ND"] * 7), ctx, 3, 2, "TND", B, lat]
def write(name, header, rows):
    with open(f"{DB}/{name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
write("PagedAttention", ATT_HEADER, [
    att_row(4, 4, 513, 10.0),              # decode 4 x 512 (+1 new token): the EXACT row for the recorded call
    att_row(4, 4, 1025, 20.0),             # decode 4 x 1024
    att_row(16, 16, 2049, 77.0),           # decode 16 x 2048
    att_row(1, 64, 64, 30.0, blocks=1, q2d=False),     # prefill 64 (Q written 3-D: TND)
    att_row(16, 16, 4097, 200.0), att_row(4, 4, 4097, 100.0),  # same context, T 16 and 4: padded rows
    att_row(16, 16, 5121, 260.0), att_row(4, 4, 5121, 120.0),
    att_row(8, 8, 513, 11.0, dtype="DT_FLOAT16"),   # float16 spelled DT_FLOAT16: never matches
])
# the same decode rows without the Runtime input_layout column (the interpolation regime needs it)
write("NoLayout", [h for h in ATT_HEADER if h != "Runtime input_layout"],
      [[c for i, c in enumerate(r) if i != 6] for r in (att_row(4, 4, 513, 10.0), att_row(4, 4, 1025, 20.0))])
no_batch = [[c for i, c in enumerate(r) if i != 7] for r in (
    att_row(16, 16, 4097, 200.0), att_row(4, 4, 4097, 100.0), att_row(16, 16, 5121, 260.0), att_row(4, 4, 5121, 120.0))]
write("NoBatch", [h for h in ATT_HEADER if h != "Runtime batch_size"], no_batch)
write("Unique", ATT_HEADER, [att_row(16, 16, 4097, 200.0), att_row(4, 4, 4097, 100.0), att_row(4, 4, 5121, 120.0),
                             att_row(16, 16, 5121, 260.0)])
write("ReshapeAndCache", ["Input Shapes", "Input Data Types", "Input Formats", "Average Duration(us)"], [
    ["4,32;4,32;2,17,128,2,16;4", "DT_BF16;DT_BF16;DT_BF16;INT64", "ND;ND;ND;ND", 3.0],
    ["64,32;64,32;2,1,128,2,16;64", "DT_BF16;DT_BF16;DT_BF16;INT64", "ND;ND;ND;ND", 4.0]])
write("ReshapeAndCacheNdKernel", ["Input Shapes", "Input Data Types", "Input Formats", "Average Duration(us)"], [
    ["4,1,32;4,1,32;17,128,2,16;17,128,2,16;4", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT64", "ND;ND;ND;ND;ND", 3.5]])
write("IndexSelect", ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Average Duration(us)"], [
    ["512,16;4", "DT_BF16;INT64", "ND;ND", "4,16", 2.0], ["512,16;64", "DT_BF16;INT64", "ND;ND", "64,16", 2.5],
    ["1024,16;4", "DT_BF16;INT64", "ND;ND", "4,16", 2.2]])
write("Cat", ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Average Duration(us)"], [
    ["1,4,64,8;1,4,64,8", "DT_BF16;DT_BF16", "ND;ND", "1,4,64,16", 1.5]])

def meta(shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


base = ProfilingDataSource(DB)
wrapper = InterpolatingDataSource(base)
def ask(label, op, args, out):
    info = OpInvokeInfo(op, args, {}, out)
    hit = base.lookup(info)
    exact = None if hit is None or hit.source == QuerySource.PARTIAL else hit.latency_us
    base_reason = base.last_miss_reason
    result = wrapper.lookup(info)
    answer = {"exact": exact, "base_miss": None if exact is not None else base_reason}
    if result is None:
        answer["miss"] = wrapper.last_miss_reason
    else:
        d = result.details
        answer.update(source=result.source.name, latency_us=round(result.latency_us, 3),
                      rule=result.shape_match_info.shape_match_rule if result.shape_match_info else None,
                      method=d.get("method"), axes=d.get("axes"), bounds=d.get("axis_boundary"),
                      merged=[m.get("duplicate_count") for m in d.get("matched_row_meta", []) if m.get("duplicate_count")])
    print(f"{label:58s}", json.dumps(answer), flush=True)
def attention(B, ctx, q_len=1, dtype=torch.float16, blocks=17, op=torch.ops.tensor_cast.attention.default):
    T = B * q_len
    q = meta((T, 64), dtype)
    k = meta((blocks, 128, 2, 16), dtype)
    args = (q, k, k, None, meta((B, -(-ctx // 128)), torch.int64), torch.arange(0, T + 1, q_len),
            torch.full((B,), ctx), torch.full((B,), q_len))
    return op, args, meta((T, 64), dtype)
print("== tensor_cast.attention")
ask("decode 4 x 512 (seq_lens 513), float16", *attention(4, 513))
ask("decode 4 x 512, bfloat16", *attention(4, 513, dtype=torch.bfloat16))
ask("decode 4 x 512, float32 (FLOAT)", *attention(4, 513, dtype=torch.float32))
ask("decode 4, seq_lens 529 (+16)", *attention(4, 529))
ask("decode 4, seq_lens 530 (+17)", *attention(4, 530))
ask("decode 4, seq_lens 769 (between 513 and 1025)", *attention(4, 769))
ask("decode 16 x 512 (seq 513): T 16 pads onto the T 4 row", *attention(16, 513))
ask("decode 1, seq 513: T 1 and T 4 unrelated", *attention(1, 513))
ask("decode 4, seq 4609 (between 4097 and 5121, T4+T16 rows)", *attention(4, 4609))
ask("decode 16, seq 4609", *attention(16, 4609))
ask("decode 8, seq 513: only a DT_FLOAT16 row", *attention(8, 513))
ask("prefill 64 (seq 64, q 64)", *attention(1, 64, q_len=64, blocks=1))
ask("prefill 60: block-padded onto T 64", *attention(1, 60, q_len=60, blocks=1))
ask("mixed-free: 2 x prefill 32 (T 64, seq 32)", *attention(2, 32, q_len=32, blocks=1))
ask("no Runtime input_layout column, seq 769 (interp.)", *attention(4, 769, op=torch.ops.aten.mm.default))
ask("no Runtime input_layout column, seq 513 (exact)", *attention(4, 513, op=torch.ops.aten.mm.default))
ask("decode 4 x 4096 (rows T16 then T4 at 4097)", *attention(4, 4097))
ask("decode 16 x 4096", *attention(16, 4097))
ask("no batch column: decode 4, seq 4609 (median merge)", *attention(4, 4609, op=torch.ops.aten.bmm.default))
ask("no batch column: decode 4 x 4096 (file order)", *attention(4, 4097, op=torch.ops.aten.bmm.default))
ask("require_semantic_unique: decode 4 x 4096", *attention(4, 4097, op=torch.ops.aten.addmm.default))
ask("require_semantic_unique: decode 16 x 4096", *attention(16, 4097, op=torch.ops.aten.addmm.default))
ask("require_semantic_unique: decode 4, seq 4100", *attention(4, 4100, op=torch.ops.aten.addmm.default))
print("== tensor_cast.reshape_and_cache")
rc = torch.ops.tensor_cast.reshape_and_cache.default
ask("decode 4 (kv_cache 2,17,128,2,16)", rc, (meta((4, 32)), meta((4, 32)), meta((2, 17, 128, 2, 16)), meta((4,), torch.int64)), None)
ask("decode 4, cache 2,20,... (different block count)", rc, (meta((4, 32)), meta((4, 32)), meta((2, 20, 128, 2, 16)), meta((4,), torch.int64)), None)
ask("decode 5 (no row)", rc, (meta((5, 32)), meta((5, 32)), meta((2, 17, 128, 2, 16)), meta((5,), torch.int64)), None)
ask("decode 4, Ascend 5-slot row (ReshapeAndCacheNdKernel)", torch.ops.aten.add.Tensor, (meta((4, 32)), meta((4, 32)), meta((2, 17, 128, 2, 16)), meta((4,), torch.int64)), None)
print("== rotary index_select / cat")
isel = torch.ops.aten.index_select.default
ask("index_select cos[512,16] by 4 positions", isel, (meta((512, 16)), 0, meta((4,), torch.int64)), meta((4, 16)))
ask("index_select cos[512,16] by 5 positions", isel, (meta((512, 16)), 0, meta((5,), torch.int64)), meta((5, 16)))
ask("index_select cos[768,16] by 4 (axis 0 interp.)", isel, (meta((768, 16)), 0, meta((4,), torch.int64)), meta((4, 16)))
ask("index_select float32", isel, (meta((512, 16), torch.float32), 0, meta((4,), torch.int64)), meta((4, 16), torch.float32))
cat = torch.ops.aten.cat.default
ask("cat 2 x [1,4,64,8] (rotate_half, prefill 64)", cat, ([meta((1, 4, 64, 8)), meta((1, 4, 64, 8))], -1), meta((1, 4, 64, 16)))
ask("cat 2 x [1,4,60,8]", cat, ([meta((1, 4, 60, 8)), meta((1, 4, 60, 8))], -1), meta((1, 4, 60, 16)))
