"""A real framework's model as the workload: transformers configs (dense and MoE) profiled on CPU, parsed as a
user's trace (no workload.json) and every row of the ops nobody wrote a definition for built from its schema."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from itertools import zip_longest

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conftest import REPO

pytest.importorskip("transformers")

from opperf.errors import OpperfError  # noqa: E402
from opperf.workload.transformers_model import read_config  # noqa: E402

CONFIGS = REPO / "tests" / "data" / "workload"


@pytest.fixture(scope="module")
def moe_database(tmp_path_factory):
    """tiny_qwen2_moe (6 experts, top-3, shared expert), 2 layers: prefill 8 and 24, one decode step."""
    root = tmp_path_factory.mktemp("hf")
    profile = subprocess.run([sys.executable, str(REPO / "scripts" / "profile_workload.py"), "--transformers-config",
                              str(CONFIGS / "tiny_qwen2_moe.json"), "--prefill-lengths", "8", "24", "--decode-steps",
                              "1", "--decode-context", "8", "--output", str(root / "profile")],
                             capture_output=True, text=True, timeout=600)
    assert profile.returncode == 0, profile.stderr
    manifest = root / "profile" / "workload.json"
    assert '"source": "transformers"' in manifest.read_text() and '"Qwen2MoeForCausalLM"' in manifest.read_text()
    manifest.unlink()                      # parse it as a user's trace comes: no workload.json
    parse = subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"), "--profiling-path",
                            str(root / "profile" / "trace.json"), "--database-path", str(root / "db")],
                           capture_output=True, text=True, timeout=600)
    assert parse.returncode == 0, parse.stderr
    assert "TensorList member dtypes taken from the op's child ops" in parse.stderr
    return root / "db"


def _rows(database, kernel_type):
    with open(database / f"{kernel_type}.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_moe_ops_without_definitions_replay_from_their_schema(moe_database):
    from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, definition_index
    from opperf.replay.engine import STATUS_OK, replay_row
    from opperf.replay.job import recipe_for
    from opperf.replay.timing import CpuProfilerTimer

    defined = definition_index(DEFAULT_DEFINITIONS_DIR / "torch")
    types = [line for line in (moe_database / "kernel_types.txt").read_text().split() if line]
    undefined = [t for t in types if t not in defined]
    # The router and dispatch ops of a transformers MoE layer, none with a definition file.
    # Which glue ops a MoE layer launches depends on the transformers release (5.17: masked_fill_, clamp_,
    # ge, gt; 5.23 routes differently); index and index_put_ gather and scatter the tokens in every one.
    assert {"index", "_index_put_impl_"} <= set(undefined) and len(undefined) >= 4, undefined
    timer = CpuProfilerTimer()
    for kernel_type in undefined:
        recipe = recipe_for(kernel_type, "cpu", None)
        for row in _rows(moe_database, kernel_type):
            outcome = replay_row(recipe, row, backend="cpu", device="cpu", timer=timer, repeat_count=1,
                                 warmup_count=1)
            assert outcome.status == STATUS_OK, (kernel_type, row["Input Shapes"], outcome.error)
            assert outcome.recipe.startswith(f"schema aten::{kernel_type}.")


def test_index_lists_and_tensor_list_dtypes_come_from_the_trace(moe_database):
    index_rows = _rows(moe_database, "index")
    assert index_rows and all(r["Input Data Types"].split(";")[1] in ("DT_INT64", "DT_BOOL") for r in index_rows)
    assert all(r["Output Shapes"] for r in index_rows)
    cat_rows = _rows(moe_database, "cat")
    assert cat_rows and all(set(r["Input Data Types"].strip(";").split(";")) == {"DT_FLOAT"} for r in cat_rows)


def test_a_config_without_model_type_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 64}')
    with pytest.raises(OpperfError, match="needs a `model_type`"):
        read_config(path)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(OpperfError, match="not valid JSON"):
        read_config(tmp_path / "bad.json")


def _check_workflow_with_model(tmp_path, model: str) -> None:
    """The workflow's load-time check (rules/common.smk) of config/config.yaml with `model` as the workload and the
    cpu grid's target."""
    import yaml

    from opperf.workflow_config import check_workflow
    from opperf.yaml_files import read_yaml

    config = read_yaml(REPO / "config" / "config.yaml", "workflow config")
    config["workload"]["model"] = model
    config["grid"]["target_models"] = {"cpu": [model]}
    path = tmp_path / "my_model.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    check_workflow(config, config_files=[path], definitions_root=REPO / "config" / "kernels")


def test_an_olmoe_config_passes_the_workflows_model_check(tmp_path, monkeypatch):
    """OLMoE's convention (num_experts x intermediate_size, no moe_intermediate_size) is a MoE model the workflow
    takes; a mistyped path beside it is refused with the closest config.json."""
    monkeypatch.chdir(REPO)
    _check_workflow_with_model(tmp_path, "tests/data/workload/tiny_olmoe.json")
    with pytest.raises(OpperfError) as raised:
        _check_workflow_with_model(tmp_path, "tests/data/workload/tiny_olmo.json")
    assert str(raised.value).endswith(
        "field 'workload.model': tests/data/workload/tiny_olmo.json: cannot read the model config: No such file or "
        "directory; closest: tests/data/workload/tiny_olmoe.json")


def test_num_layers_cuts_per_layer_lists(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "qwen2_moe", "num_hidden_layers": 4, "layer_types": ["full_attention", '
                    '"full_attention", "full_attention", "full_attention"], "mlp_only_layers": [1, 3]}')
    config = read_config(tmp_path, num_layers=2)
    assert config["num_hidden_layers"] == 2 and config["layer_types"] == ["full_attention"] * 2
    assert config["mlp_only_layers"] == [1]


def test_a_model_without_sdpa_is_profiled_with_its_eager_attention(caplog):
    """Gemma-2 (logit soft-capping) has no sdpa path in transformers: it is built with eager attention, said in the
    log and in workload.json's description, instead of transformers refusing the model."""
    import logging

    import torch

    from opperf.workload.transformers_model import TransformersCausalLM

    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 64, "pad_token_id": None}
    with caplog.at_level(logging.WARNING, logger="opperf"):
        gemma2 = TransformersCausalLM({"model_type": "gemma2", **tiny}, "cpu", torch.float32)
    assert gemma2.description["attn_implementation"] == "eager"
    assert "Gemma2ForCausalLM has no sdpa attention" in caplog.text
    logits, cache = gemma2.forward(torch.tensor([[1, 2, 3]]), 0, gemma2.new_cache())
    assert logits.shape == (1, 1, 64) and cache is not None
    llama = TransformersCausalLM({"model_type": "llama", **tiny}, "cpu", torch.float32)
    assert llama.description["attn_implementation"] == "sdpa" == llama.model.config._attn_implementation


def test_the_profile_records_the_routers_splits_beside_the_trace(moe_database):
    import json

    recorded = json.loads((moe_database.parent / "profile" / "input_values.json").read_text())
    calls = recorded["calls"]
    # Per layer and forward pass: the router's histogram, the two expert GEMMs over the same split, and the gathers
    # and the scatter that sort the tokens by expert and back (which glue ops come with them depends on the
    # transformers release: masks, for one).
    assert {"histc", "_grouped_mm", "index"} <= {call["op"] for call in calls}
    # The gathers read every row of what they index: the tokens (each top-k times), then permutations.
    indexed = [(call["shapes"][0][0], int(call["slots"]["1"])) for call in calls
               if call["op"].startswith("index") and call["op"] != "index_select"]
    assert indexed and all(rows == distinct for rows, distinct in indexed)
    # The token embedding, as the index_select inside it: at most as many distinct ids as tokens looked up.
    lookups = [(call["shapes"][2][0], int(call["slots"]["2"])) for call in calls if call["op"] == "index_select"]
    assert lookups and all(0 < distinct <= tokens for tokens, distinct in lookups)
    tokens = [call["shapes"][0][0] for call in calls if call["op"] == "_grouped_mm"]
    offsets = [list(map(int, call["slots"]["2"].split())) for call in calls if call["op"] == "_grouped_mm"]
    assert all(len(o) == 6 and o == sorted(o) and o[-1] == n for o, n in zip(offsets, tokens))
    histograms = [list(map(int, call["slots"]["0"].split())) for call in calls if call["op"] == "histc"]
    assert [sum(h) for h in histograms] == [call["shapes"][0][0] for call in calls if call["op"] == "histc"]


def test_every_tiny_architecture_builds_and_decodes():
    """benchmarks/workloads/tiny (the coverage benchmark's 24 architectures) still build in the installed
    transformers and run a prefill and a decode step over the cache."""
    import torch

    from opperf.workload.transformers_model import TransformersCausalLM

    for path in sorted((REPO / "benchmarks" / "workloads" / "tiny").glob("*.json")):
        model = TransformersCausalLM(read_config(path), "cpu", torch.float32, path=path)
        logits, cache = model.forward(torch.tensor([[1, 2, 3, 4]]), 0, model.new_cache())
        logits, cache = model.forward(torch.tensor([[5]]), 4, cache)
        assert logits.shape == (1, 1, model.vocab_size), path.name


class TensorSizeGuard(TorchDispatchMode):
    """Refuses any op that makes a tensor of `limit` elements or more: a matrix product before it runs (its output's
    shape from its inputs': the [B, H, T, T] scores of eager attention are one), any other op once it ran. Keeps the
    shape of every output it let through. It runs no op of its own, so a profile taken under it is the workload's."""

    MATRIX_PRODUCTS = {"aten::mm": 0, "aten::bmm": 0, "aten::matmul": 0, "aten::baddbmm": 1}   # first factor's slot

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.shapes = limit, set()

    def _refuse_from(self, func, shape):
        assert math.prod(shape) < self.limit, f"{func} makes a tensor of {list(shape)}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        slot = self.MATRIX_PRODUCTS.get(func._schema.name)
        if slot is not None and min(args[slot].dim(), args[slot + 1].dim()) >= 2:
            left, right = args[slot].shape, args[slot + 1].shape
            batch = [max(a, b) for a, b in zip_longest(reversed(left[:-2]), reversed(right[:-2]), fillvalue=1)]
            self._refuse_from(func, [*reversed(batch), left[-2], right[-1]])
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._refuse_from(func, tensor.shape)
                self.shapes.add(tuple(tensor.shape))
        return out


def test_a_decode_profile_at_batch_48_and_context_3000_never_holds_the_context_prefills_scores(tmp_path):
    """Issue 50: decode batch 48 at context 3,000 of a model with eager attention (GPT-OSS: attention sinks, a
    sliding-window and a full layer) died allocating the [B, H, T, T] scores of the prefill that built its KV cache.
    The cache is written instead: no op of the whole profile (model build, caches, warm-up, timed, profiled and
    execution-trace passes) makes a tensor of B*H*T*T elements, the decode step attends over all 3,000 written
    tokens, the trace holds the steps alone and workload.json says so."""
    import json

    from opperf.workload.profile import WorkloadPlan, profile_workload

    batch, heads, context = 48, 4, 3000
    config = read_config(CONFIGS / "tiny_gpt_oss.json")
    assert config["num_attention_heads"] == heads
    plan = WorkloadPlan(prefill_lengths=(8,), decode_steps=1, decode_context=context, decode_batch_sizes=(batch,))
    guard = TensorSizeGuard(batch * heads * context * context)
    with guard:
        profile_workload(None, plan, "cpu", "float32", tmp_path / "profile", transformers_config=config)
    manifest = json.loads((tmp_path / "profile" / "workload.json").read_text())
    assert manifest["attn_implementation"] == "eager"
    # The full-attention layer's scores of the decode step: one query over the 3,000 written tokens and itself.
    assert (batch, heads, 1, context + 1) in guard.shapes
    assert manifest["decode_cache"]["cache"].startswith("written before the profile, not computed: decode_context "
                                                        "tokens of random keys and values")
    assert "no prefill of the context is in the profile" in manifest["decode_cache"]["steps"]
    trace = json.loads((tmp_path / "profile" / "trace.json").read_text())["traceEvents"]
    steps = [e for e in trace if e.get("cat") == "user_annotation" and e["name"] in ("prefill_8", "decode_b48_0")]
    ops = [e for e in trace if e.get("cat") == "cpu_op" and e["name"] != "PythonDispatchMode"]   # not the guard's
    assert ops and all(any(s["ts"] <= op["ts"] <= s["ts"] + s["dur"] for s in steps) for op in ops)


def _decode_step_ops(model, cache, context):
    """Every op (and its inputs' shapes and strides) a decode step of `model` dispatches over `cache`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append((str(func), [(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    with Ops() as recorded:
        model.forward(torch.ones(cache_batch(cache), 1, dtype=torch.long), context, cache)
    return recorded.ops


def cache_batch(cache):
    return next(layer.keys.shape[0] for layer in cache.layers if getattr(layer, "keys", None) is not None)


@pytest.mark.parametrize("name, context", [("tiny_gpt_oss.json", 150), ("tiny_deepseek_v4.json", 40)])
def test_a_written_cache_gives_the_decode_step_the_kernels_a_prefilled_one_does(name, context, monkeypatch):
    """The decode step over a written cache dispatches exactly the ops, shapes and strides of the step after a
    prefill of the context, pass after pass (decoding() puts the cache back). GPT-OSS's sliding window (128) is
    past; DeepSeek-V4's compressed-attention layers hold state update() does not write, so its context is a prefill
    in chunks (CHUNK_SCORES lowered here to chunks of 7 tokens), and workload.json's note says so."""
    import torch

    import opperf.workload.transformers_model as transformers_model

    model = transformers_model.TransformersCausalLM(read_config(CONFIGS / name), "cpu", torch.float32)
    batch, heads = 2, model.model.config.num_attention_heads
    _, prefilled = model.forward(torch.randint(0, model.vocab_size, (batch, context)), 0, None)
    expected = _decode_step_ops(model, prefilled, context)
    monkeypatch.setattr(transformers_model, "CHUNK_SCORES", 7 * batch * heads * context)
    written = model.written_cache(batch, context, torch.Generator().manual_seed(0))
    for _ in range(2):
        with written.decoding() as cache:
            assert cache.get_seq_length() == context
            assert _decode_step_ops(model, cache, context) == expected
    if name == "tiny_gpt_oss.json":
        assert written.how.startswith("written before the profile")
    else:
        assert written.how.startswith("computed before the profile by a one-token forward and a prefill of the other "
                                      "decode_context - 1 tokens in chunks of 7 (its DeepseekV4CSACache, "
                                      "DeepseekV4HCACache hold state")
