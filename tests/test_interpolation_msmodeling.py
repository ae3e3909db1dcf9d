"""opperf's model of the runtime's interpolation against msmodeling's own code (opt-in).

Runs only when OPPERF_MSMODELING_DIR names a msmodeling checkout; OPPERF_MSMODELING_PYTHON may name a Python
that can import it (torch, pandas, scipy; default: this one). Every query the runtime's exact lookup misses
must get the same answer from both: the same latency (to 1e-9) and axes when the runtime interpolates, a MISS
when it returns nothing, RAISES when it raises.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opperf.consumer.interpolation import AttentionArgs, Database, Query, TensorSpec

MSMODELING = os.environ.get("OPPERF_MSMODELING_DIR")
pytestmark = pytest.mark.skipif(not MSMODELING, reason="OPPERF_MSMODELING_DIR names no msmodeling checkout")

DATA = Path(__file__).parent / "data" / "runtime_db"
ORACLE = Path(__file__).resolve().parents[1] / "opperf" / "consumer" / "msmodeling_oracle.py"
POLICY = {"kernel_overrides": {"MatMulV2": {"max_interpolation_dim": 1},
                               "FusedInferAttentionScore": {"axis_transform": "sqrt_seq"},
                               "GatherV2": {"generic_compute": {"axis": "output_numel"}}}}


def ask_msmodeling(database: Path, queries: list[Query]) -> list[dict]:
    def spec(tensor: TensorSpec):
        return [list(tensor.shape), str(tensor.dtype).removeprefix("torch.")]

    request = {"database": str(database), "queries": [
        {"op_name": q.op_name, "inputs": [spec(t) for t in q.inputs], "outputs": [spec(t) for t in q.outputs],
         "attention": None if q.attention is None else {
             "query": spec(q.attention.query), "key": spec(q.attention.key), "seq_lens": list(q.attention.seq_lens),
             "has_query_lens": q.attention.has_query_lens}} for q in queries]}
    python = os.environ.get("OPPERF_MSMODELING_PYTHON", sys.executable)
    done = subprocess.run([python, str(ORACLE), MSMODELING], input=json.dumps(request), capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _mm(m, k, n, dtype, lead=()):
    return Query("aten.mm.default", (TensorSpec((*lead, m, k), dtype), TensorSpec((k, n), dtype)),
                 (TensorSpec((*lead, m, n), dtype),))


def _add(shape, other, dtype):
    return Query("aten.add.Tensor", (TensorSpec(shape, dtype), TensorSpec(other, dtype)), (TensorSpec(shape, dtype),))


def npu_queries(rng: random.Random) -> list[Query]:
    import torch

    queries = []
    for _ in range(150):
        k, n = rng.choice([(5120, 10240), (8192, 5120), (25600, 5120), (4096, 3072), (1536, 4096), (5120, 5120)])
        dtype = rng.choice([torch.bfloat16, torch.bfloat16, torch.float32, torch.float16])
        lead = rng.choice([(), (), (1,), (2,)])
        queries.append(_mm(rng.choice([1, 2, 7, 8, 64, 100, 128, 300, 512, 700, 1000, 2048, 3000, 5000, 8192, 9000,
                                       rng.randint(1, 9000)]), k, n, dtype, lead))
    for _ in range(60):
        hidden = rng.choice([5120, 8192, 4096])
        tokens = rng.choice([1, 2, 100, 128, 700, 1024, 3000, 4096, 5000, rng.randint(1, 5000)])
        shape = rng.choice([(1, tokens, hidden), (tokens, hidden), (8, tokens, hidden)])
        other = rng.choice([shape, (hidden,)])
        queries.append(_add(shape, other, rng.choice([torch.bfloat16, torch.float32])))
    for _ in range(30):
        tokens = rng.choice([1, 4, 8, 64, 128, 500, 1024, 2000, 4096, 5000])
        queries.append(Query("aten.embedding.default", (TensorSpec((151936, 5120), torch.bfloat16),
                                                        TensorSpec((1, tokens), torch.int64)),
                             (TensorSpec((1, tokens, 5120), torch.bfloat16),)))
    for _ in range(60):
        batch = rng.choice([1, 2, 8, 16, 20, 64])
        seq = rng.choice([100, 128, 300, 1025, 1500, 2048, 4096, 6000, 8192, 9000])
        q = TensorSpec((batch, 64, 1, 128), torch.bfloat16)
        key = TensorSpec((batch, rng.choice([8, 8, 4]), seq, 128), torch.bfloat16)
        queries.append(Query("tensor_cast.attention.default", (q, key, key), (q,),
                             AttentionArgs(q, key, tuple([seq] * batch))))
    return queries


def cpu_queries(rng: random.Random) -> list[Query]:
    import torch

    f32 = torch.float32
    queries = [_mm(rng.choice([1, 2, 5, 8, 12, 16, 20, 32, 40, 48, 63, 100, 200, 255, 300]), k, n, f32,
                   rng.choice([(), (1,)]))
               for k, n in [(256, 512), (256, 256), (256, 1376), (688, 256), (256, 4096), (128, 256), (256, 2048)]
               for _ in range(6)]
    for _ in range(40):
        tokens = rng.choice([1, 2, 3, 5, 10, 16, 30, 40, 64, 100])
        shape = rng.choice([(1, tokens, 256), (2, tokens, 344), (1, 8, tokens, 32), (1, tokens, 1), (tokens, 256)])
        queries.append(_add(shape, shape, f32))
    for _ in range(30):
        heads, q_len, kv_len = rng.choice([8, 4]), rng.choice([1, 1, 16, 40]), rng.choice([3, 9, 20, 66, 100, 200])
        qs = TensorSpec((1, heads, q_len, 32), f32)
        kv = TensorSpec((1, heads, kv_len if q_len == 1 else q_len, 32), f32)
        queries.append(Query("aten._scaled_dot_product_flash_attention_for_cpu.default", (qs, kv, kv),
                             (qs, TensorSpec((1, heads, q_len), f32))))
    return queries


def cuda_queries(rng: random.Random) -> list[Query]:
    import torch

    return [_mm(rng.randint(1, 9000), k, n, torch.bfloat16)
            for k, n in [(5120, 10240), (8192, 5120), (5120, 51200), (25600, 5120), (5120, 151936)] for _ in range(20)]


def with_policy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    mapping = yaml.safe_load((target / "op_mapping.yaml").read_text())
    mapping["interpolation_policy"] = POLICY
    (target / "op_mapping.yaml").write_text(yaml.safe_dump(mapping))
    return target


@pytest.mark.slow
@pytest.mark.parametrize("name, policy", [("npu", False), ("npu", True), ("cpu", False), ("cuda", False)])
def test_model_answers_as_msmodeling_does(name, policy, tmp_path):
    database = with_policy(DATA / name, tmp_path) if policy else DATA / name
    queries = {"npu": npu_queries, "cpu": cpu_queries, "cuda": cuda_queries}[name](random.Random(19))
    theirs = ask_msmodeling(database, queries)
    model = Database.load(database)
    compared = interpolated = 0
    for query, answer in zip(queries, theirs):
        if answer["exact"] is not None:
            continue
        ours = model.interpolate(query)
        compared += 1
        where = f"{query}: msmodeling {answer}, opperf {ours}"
        if answer["raised"]:
            assert ours.status == "RAISES", where
        elif answer["source"] == "INTERPOLATED":
            interpolated += 1
            assert ours.status in ("INTERPOLATED", "ILLEGAL"), where
            assert ours.latency_us == pytest.approx(answer["latency_us"], rel=1e-9), where
            assert list(ours.axes) == answer["axes"], where
        else:
            assert ours.status == "MISS", where
    assert compared >= len(queries) // 3 and interpolated >= 5, (compared, interpolated)


@pytest.mark.slow
def test_consumer_answers_match_msmodeling(repo):
    """The consumer's view: the reference decoder's queries at the demo model's dims, answered by `answer`
    (opperf's models of the exact lookup and of the interpolation step) as msmodeling's full lookup does."""
    import torch

    from opperf.consumer.queries import answer, modelled_exact_lookup, reference_queries
    from opperf.consumer.scenarios import Scenario

    recorded = reference_queries(repo / "config" / "models.yaml",
                                 [Scenario("opperf-tiny", tp, "prefill", 1, t) for tp in (1, 2) for t in (16, 40, 64)]
                                 + [Scenario("opperf-tiny", 1, "decode", b, 1, 64) for b in (1, 2)],
                                 dtype=torch.float32, attention="cpu")
    database = DATA / "cpu"
    theirs = ask_msmodeling(database, [r.query for r in recorded])
    by_query = {r.query: a for r, a in zip(recorded, theirs)}

    statuses = set()
    for item in answer(recorded, database, modelled_exact_lookup):
        full = by_query[item.recorded.query]
        statuses.add(item.status)
        where = f"{item}: msmodeling {full}"
        if full["raised"]:
            assert item.status == "RAISES", where
        elif full["exact"] is not None:
            assert item.status in ("EXACT", "ZERO_COST") and item.latency_us == pytest.approx(full["exact"]), where
        elif full["source"] == "INTERPOLATED":
            assert item.status in ("INTERPOLATED", "ILLEGAL"), where
            assert item.latency_us == pytest.approx(full["latency_us"], rel=1e-9), where
        else:
            assert item.status == "MISS", where
    assert {"EXACT", "INTERPOLATED", "MISS"} <= statuses, statuses
