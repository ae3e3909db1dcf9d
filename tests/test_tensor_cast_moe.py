"""TensorCast's MoE routing ops as kernel types: `MoeGatingTopK`, `MoeTokenPermute` and `MoeTokenUnpermute` rows (the
calls msmodeling's runner issues for a tiny glm4_moe: hidden 64, 8 experts, top 2) are laid from the recorded calls,
replay on the cpu through their definitions (opperf.consumer.moe_routing, exact against a simple reference), build
into a database, and msmodeling's own data sources answer the runner's calls from those rows exactly, and a token
count between two rows by interpolation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from opperf import contract
from opperf.consumer.moe_routing import (balanced_expert_ids, init_routing_v2, moe_gating_top_k_softmax,
                                         unpermute_tokens)
from opperf.consumer.msmodeling_env import find_msmodeling
from opperf.consumer.msmodeling_gate import call_inputs, gate_lines, writes_nothing
from opperf.consumer.msmodeling_queries import (GATING_OP, PERMUTE_OP, UNPERMUTE_OP, ask_msmodeling, expert_count,
                                                ScenarioCalls, expert_split_scenarios, moe_routing_width,
                                                record_model_queries, rows_from_calls)
from opperf.consumer.scenarios import ScenarioSpace, load_scenario_space
from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, load_definition
from opperf.replay.engine import STATUS_FAILED_BUILD, STATUS_OK, replay_row
from opperf.replay.inputs import build_case
from opperf.replay.timing import CpuProfilerTimer
from test_replay_tensor_cast import _read, replayed_database

REPO = Path(__file__).resolve().parent.parent
DEFINITIONS = DEFAULT_DEFINITIONS_DIR / "torch"
TINY_GLM4_MOE = REPO / "tests" / "data" / "workload" / "tiny_glm4_moe.json"
INSTALL = find_msmodeling()
needs_msmodeling = pytest.mark.skipif(INSTALL is None, reason="no msmodeling checkout: set OPPERF_MSMODELING_DIR or "
                                                              "lay the pinned copy in ../shared/msmodeling")
HIDDEN, EXPERTS, TOP_K = 64, 8, 2
KERNEL_TYPES = ("MoeGatingTopK", "MoeTokenPermute", "MoeTokenUnpermute")


def moe_rows(tokens: int) -> dict[str, dict[str, str]]:
    """The rows laid for one step of `tokens` tokens of tiny_glm4_moe (float16 calls as bfloat16 rows)."""
    routed, common = tokens * TOP_K, {contract.OP_STATE: "eager", contract.ACCELERATOR_CORE: "CPU"}
    tail = {contract.SOURCE: "generated"}
    return {
        "MoeGatingTopK": {**common, contract.INPUT_SHAPES: f"{tokens},{EXPERTS};", contract.INPUT_DTYPES: "FLOAT;",
                          contract.INPUT_FORMATS: "ND;", contract.OUTPUT_SHAPES: f"{tokens},{TOP_K};{tokens},{TOP_K}",
                          contract.OUTPUT_DTYPES: "FLOAT;INT64", contract.OUTPUT_FORMATS: "ND;ND",
                          contract.INPUT_SCALARS: f";{TOP_K}", **tail, contract.CONSUMER_QUERY: GATING_OP},
        "MoeTokenPermute": {**common, contract.INPUT_SHAPES: f"1,{tokens},{HIDDEN};{tokens},{TOP_K}",
                            contract.INPUT_DTYPES: "DT_BF16;INT64", contract.INPUT_FORMATS: "ND;ND",
                            contract.OUTPUT_SHAPES: f"{routed},{HIDDEN}", contract.OUTPUT_DTYPES: "DT_BF16",
                            contract.OUTPUT_FORMATS: "ND", contract.INPUT_SCALARS: "",
                            "Runtime num_experts": str(EXPERTS), **tail, contract.CONSUMER_QUERY: PERMUTE_OP},
        "MoeTokenUnpermute": {**common, contract.INPUT_SHAPES: f"{routed},{HIDDEN};{tokens},{TOP_K}",
                              contract.INPUT_DTYPES: "DT_BF16;INT64", contract.INPUT_FORMATS: "ND;ND",
                              contract.OUTPUT_SHAPES: f"{tokens},{TOP_K},{HIDDEN}", contract.OUTPUT_DTYPES: "DT_BF16",
                              contract.OUTPUT_FORMATS: "ND", contract.INPUT_SCALARS: "",
                              "Runtime num_experts": str(EXPERTS), **tail, contract.CONSUMER_QUERY: UNPERMUTE_OP}}


PREFILL, DECODE = moe_rows(16), moe_rows(4)      # prefill:16, decode:4x512


# --- the computations ------------------------------------------------------------------------------------------


def test_gating_is_the_softmax_then_each_tokens_top_k():
    logits = torch.randn(5, EXPERTS, generator=torch.Generator().manual_seed(1))
    weights, ids = moe_gating_top_k_softmax(logits, 3)
    probabilities = torch.softmax(logits, dim=-1)
    for token in range(5):
        ranked = sorted(range(EXPERTS), key=lambda expert: -float(probabilities[token, expert]))[:3]
        assert ids[token].tolist() == ranked
        assert torch.equal(weights[token], probabilities[token, ranked])
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32


def test_permute_puts_each_tokens_copies_in_expert_order_and_unpermute_returns_them():
    tokens, top_k, hidden = 6, 3, 4
    x = torch.randn(1, tokens, hidden, generator=torch.Generator().manual_seed(2)).bfloat16()
    ids = torch.tensor([[2, 0, 5], [0, 2, 1], [5, 4, 0], [1, 2, 3], [3, 0, 2], [4, 5, 1]])
    # Reference: copy j of token t (flat position t * k + j) sorted by expert id, ties in flat order.
    copies = sorted((int(ids[t, j]), t * top_k + j) for t in range(tokens) for j in range(top_k))
    expected = torch.stack([x[0, position // top_k] for _, position in copies])
    permuted = init_routing_v2(x, ids)
    assert torch.equal(permuted, expected)
    assert [expert for expert, _ in copies][:4] == [0, 0, 0, 0]
    # Unpermute: row i of its input back to the flat position it was taken from.
    rows = torch.randn(tokens * top_k, hidden, generator=torch.Generator().manual_seed(3))
    back = torch.empty(tokens, top_k, hidden)
    for row, (_, position) in enumerate(copies):
        back[position // top_k, position % top_k] = rows[row]
    assert torch.equal(unpermute_tokens(rows, ids), back)
    assert torch.equal(unpermute_tokens(permuted, ids), x[0].unsqueeze(1).expand(tokens, top_k, hidden))


@pytest.mark.parametrize(("tokens", "top_k", "experts"), [(4, 2, 8), (16, 2, 8), (7, 3, 5), (1, 1, 1), (33, 8, 128)])
def test_balanced_expert_ids_give_each_expert_its_share_and_each_token_distinct_experts(tokens, top_k, experts):
    ids = balanced_expert_ids(tokens, top_k, experts, seed=11)
    assert ids.shape == (tokens, top_k) and ids.dtype == torch.int64
    share = tokens * top_k // experts
    assert set(torch.bincount(ids.reshape(-1), minlength=experts).tolist()) <= {share, share + 1}
    assert all(len(set(row)) == top_k for row in ids.tolist())
    assert torch.equal(ids, balanced_expert_ids(tokens, top_k, experts, seed=11))


def test_balanced_expert_ids_are_shuffled_by_the_seed_and_refuse_more_picks_than_experts():
    assert not torch.equal(balanced_expert_ids(64, 2, 8, seed=1), balanced_expert_ids(64, 2, 8, seed=2))
    with pytest.raises(ValueError, match="top_k 9 must be between 1 and the 8 experts"):
        balanced_expert_ids(4, 9, 8)


# --- the rows -----------------------------------------------------------------------------------------------------


def _topk_call(op: str, scores: list[int], picked: list[int]) -> dict:
    return {"op": op, "args": [{"shape": scores, "dtype": "float32"}, picked[-1]], "kwargs": {},
            "out": [{"shape": picked, "dtype": "float32"}, {"shape": picked, "dtype": "int64"}]}


def test_the_expert_count_is_the_width_of_the_router_call_that_picked_the_ids():
    ids = {"shape": [4, 2], "dtype": "int64"}
    group_topk = _topk_call("aten.topk.default", [4, 1, 8], [4, 1, 2])        # glm4's group scores: other shape
    assert expert_count(ids, [group_topk, _topk_call("aten.topk.default", [4, 6], [4, 2])]) == 6   # qwen3_moe's gate
    # The fused gating where the step has it, over aten.topk of other scores of the same shape.
    assert expert_count(ids, [_topk_call("aten.topk.default", [4, 3], [4, 2]),
                              _topk_call(GATING_OP, [4, 8], [4, 2])]) == 8
    assert expert_count(ids, [group_topk]) is None
    assert expert_count(ids, [_topk_call("aten.topk.default", [4, 6], [4, 2]),
                              _topk_call("aten.topk.default", [4, 5], [4, 2])]) is None      # which one?


@pytest.fixture(scope="module")
def recorded():
    if INSTALL is None:
        pytest.skip("no msmodeling checkout: set OPPERF_MSMODELING_DIR or lay the pinned copy in ../shared/msmodeling")
    return record_model_queries(INSTALL, TINY_GLM4_MOE, ["prefill:16", "decode:4x512"], timeout_s=600)


@needs_msmodeling
def test_rows_are_the_runners_routing_calls_one_per_distinct_call(recorded):
    laid = rows_from_calls(recorded, "CPU")
    for kernel_type in KERNEL_TYPES:
        assert laid.rows[kernel_type] == [PREFILL[kernel_type], DECODE[kernel_type]], kernel_type
    assert laid.not_laid_out == {}
    decode = recorded.scenarios[1].calls
    # glm4_moe: layer 0 dense, the MoE layers after it: one call per step at 2 layers, 2 at the config's 3
    assert [(c["count"], c["full_depth_count"]) for c in decode if c["op"] in (GATING_OP, PERMUTE_OP, UNPERMUTE_OP)
            ] == [(1, 2)] * 3


@needs_msmodeling
def test_the_routing_width_is_the_permutes_top_k_and_its_routers_experts(recorded):
    assert moe_routing_width(recorded.scenarios) == (TOP_K, EXPERTS)
    assert moe_routing_width([ScenarioCalls("dense", [], [c for c in recorded.scenarios[0].calls
                                                           if c["op"] != PERMUTE_OP])]) is None


def test_expert_splits_are_the_token_counts_between_the_points_where_an_expert_gets_fewer_than_two_tokens():
    # 8 experts, top-2: 2 x tokens copies < 16 below 8 tokens, and 8 itself, where every expert's block is 2
    # rows and the interpolation's regime begins; the points are recorded already, and decode at the smallest
    # context only (the MoE calls do not depend on it).
    space = ScenarioSpace(prefill_tokens=(1, 4, 64), decode_batches=(2, 4, 16), decode_contexts=(512, 256))
    assert expert_split_scenarios(space, 2, 8) == [
        "prefill:2", "prefill:3", "prefill:5", "prefill:6", "prefill:7", "prefill:8",
        "decode:3x256", "decode:5x256", "decode:6x256", "decode:7x256", "decode:8x256"]
    # ERNIE-4.5-21B-A3B's 64 experts, top-6 over the dense space: up to 22 tokens (132 copies, 2 per expert)
    dense = load_scenario_space(REPO / "config" / "scenarios.yaml", "dense")
    assert expert_split_scenarios(dense, 6, 64) == [
        *(f"prefill:{t}" for t in (9, 11, 13, 15, 17, 18, 19, 21, 22)),
        *(f"decode:{b}x256" for b in (3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22))]
    # GLM-4.5-Air's 128, top-8: up to 32 tokens, a point of the dense space
    assert expert_split_scenarios(dense, 8, 128)[-1] == "decode:31x256"
    assert expert_split_scenarios(space, 1, 1) == ["prefill:2"]     # 2 tokens give the one expert 2 copies


# --- replay and msmodeling's lookup -------------------------------------------------------------------------------


def definition(kernel_type: str):
    return load_definition(DEFINITIONS / f"{kernel_type}.yaml")


def test_a_permute_row_replays_over_balanced_ids_and_its_recipe_says_so():
    case = build_case(definition("MoeTokenPermute"), DECODE["MoeTokenPermute"], "cpu")
    ids = case.kwargs["topk_indices"]
    assert ids.shape == (4, TOP_K) and sorted(ids.reshape(-1).tolist()) == list(range(EXPERTS))
    assert case.kwargs["x"].shape == (1, 4, HIDDEN) and case.kwargs["x"].dtype == torch.bfloat16
    assert case.recipe == ("definition config/kernels/torch/MoeTokenPermute.yaml; expert ids laid as a router aims to "
                           "route (msmodeling records them without values): 4 tokens x 2 over 8 experts, each expert 1")
    assert torch.equal(case.run(), init_routing_v2(case.kwargs["x"], ids))
    gating = build_case(definition("MoeGatingTopK"), PREFILL["MoeGatingTopK"], "cpu")
    assert gating.kwargs["x"].shape == (16, EXPERTS) and gating.kwargs["top_k"] == TOP_K
    assert [tuple(t.shape) for t in gating.run()] == [(16, TOP_K)] * 2


@pytest.mark.parametrize(("kernel_type", "row", "error"), [
    ("MoeTokenPermute", {**DECODE["MoeTokenPermute"], "Runtime num_experts": ""},
     "field 'Runtime num_experts': the row has no Runtime num_experts: the experts the ids route over (the shapes do "
     "not carry it)"),
    ("MoeTokenUnpermute", {**DECODE["MoeTokenUnpermute"], "Runtime num_experts": "1"},
     "field 'Runtime num_experts': topk_indices [4, 2] picks 2 distinct experts of each token's; Runtime num_experts "
     "is 1"),
    ("MoeTokenUnpermute", {**DECODE["MoeTokenUnpermute"], contract.INPUT_SHAPES: "16,64;4,2"},
     "field 'Input Shapes': x [16, 64] is not the [8, hidden] rows of topk_indices [4, 2] (one per token and expert)"),
    ("MoeTokenPermute", {**DECODE["MoeTokenPermute"], contract.INPUT_SHAPES: "1,5,64;4,2"},
     "field 'Input Shapes': x [1, 5, 64] holds 5 tokens; topk_indices [4, 2] routes 4"),
    ("MoeGatingTopK", {**DECODE["MoeGatingTopK"], contract.INPUT_SCALARS: ";9"},
     "field 'Input Scalars': top_k is 9: Input Scalars' slot 1 must be an integer k from 1 to the 8 experts of "
     "logits [4, 8]"),
])
def test_a_row_that_contradicts_itself_is_refused_naming_the_column(kernel_type, row, error):
    outcome = replay_row(definition(kernel_type), row, backend="cpu", device="cpu", timer=CpuProfilerTimer(threads=1),
                         repeat_count=1, warmup_count=1)
    assert (outcome.status, outcome.error) == (STATUS_FAILED_BUILD, error)
    assert contract.REPLAY_AVERAGE not in outcome.columns


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> Path:
    """The rows replayed on the cpu by scripts/replay.py, built into a database by scripts/build_database.py."""
    return replayed_database(tmp_path_factory.mktemp("tensor_cast_moe"),
                             {kernel_type: [PREFILL[kernel_type], DECODE[kernel_type]] for kernel_type in KERNEL_TYPES})


def test_each_row_replays_on_the_cpu_through_its_definition(database):
    for kernel_type in KERNEL_TYPES:
        rows = _read(database / "layouts" / f"{kernel_type}.csv")
        assert rows[contract.REPLAY_STATUS].tolist() == [STATUS_OK] * 2, rows[contract.REPLAY_ERROR].tolist()
        assert all(float(d) > 0 for d in rows[contract.REPLAY_AVERAGE])
    mappings = yaml.safe_load((database / "op_mapping.yaml").read_text())["operator_mappings"]
    for op, kernel_type in ((GATING_OP, "MoeGatingTopK"), (PERMUTE_OP, "MoeTokenPermute"),
                            (UNPERMUTE_OP, "MoeTokenUnpermute")):
        assert mappings[op] == {"kernel_type": kernel_type, "alternate_kernel_types": [], "category": "moe",
                                "tc_input_count": 1}


def _tensor(shape, dtype="float16"):
    return {"shape": shape, "dtype": dtype}


def _routing_calls(tokens: int) -> list[dict]:
    """The runner's three calls for a step of `tokens` tokens (msmodeling_record.py's form)."""
    ids = _tensor([tokens, TOP_K], "int64")
    return [{"op": GATING_OP, "args": [_tensor([tokens, EXPERTS], "float32"), TOP_K], "kwargs": {},
             "out": [_tensor([tokens, TOP_K], "float32"), ids]},
            {"op": PERMUTE_OP, "args": [_tensor([1, tokens, HIDDEN]), ids], "kwargs": {},
             "out": _tensor([tokens * TOP_K, HIDDEN])},
            {"op": UNPERMUTE_OP, "args": [_tensor([tokens * TOP_K, HIDDEN]), ids], "kwargs": {},
             "out": _tensor([tokens, TOP_K, HIDDEN])}]


@needs_msmodeling
def test_msmodeling_answers_the_recorded_calls_exactly_and_a_batch_between_by_interpolation(recorded, database):
    asked = [c for scenario in recorded.scenarios for c in scenario.calls if c["op"] in (GATING_OP, PERMUTE_OP,
                                                                                           UNPERMUTE_OP)]
    assert [json.dumps(c["args"]) for c in asked] == [json.dumps(c["args"]) for c in [*_routing_calls(16),
                                                                                      *_routing_calls(4)]]
    answers = ask_msmodeling(INSTALL, database, [*asked, *_routing_calls(10)], timeout_s=300)
    replayed = {kernel_type: [float(d) for d in _read(database / "layouts" / f"{kernel_type}.csv")[
        contract.REPLAY_AVERAGE]] for kernel_type in KERNEL_TYPES}
    exact = [replayed[kernel_type][step] for step in (0, 1) for kernel_type in KERNEL_TYPES]
    assert [a["source"] for a in answers[:6]] == ["MEASURED"] * 6, answers
    assert [a["exact"] for a in answers[:6]] == [a["latency_us"] for a in answers[:6]] == pytest.approx(exact,
                                                                                                        rel=1e-9)
    # 10 tokens: between the decode's 4 and the prefill's 16, along the first input's token axis (8 would not do:
    # msmodeling answers unpermute's 16 rows from the row of 8 as a block-padded match)
    for answer, kernel_type in zip(answers[6:], KERNEL_TYPES):
        assert (answer["source"], answer["path"], answer["exact"]) == ("INTERPOLATED", "interpolated", None), answer
        at_16, at_4 = replayed[kernel_type]
        assert answer["latency_us"] == pytest.approx(at_4 + (at_16 - at_4) * (10 - 4) / (16 - 4), rel=1e-6), answer


# --- the check's account of calls that write nothing -------------------------------------------------------------


def _tensor_spec(shape: list[int], dtype: str = "bfloat16") -> dict:
    return {"shape": shape, "dtype": dtype}


def test_a_cat_of_empty_expert_blocks_writes_nothing_and_the_gate_lists_it_apart():
    """msmodeling's MoE layer concatenates per-expert blocks; where the experts of a block got no token (tokens x
    top_k < experts) the cat's output has no element. On cuda no kernel runs, the row measures no device work, and
    msmodeling reads only positive latencies: no row can answer it, so the check lists it without failing."""
    empty = {"op": "aten.cat.default", "args": [[_tensor_spec([0, 64])], 0], "kwargs": {},
             "out": _tensor_spec([0, 64])}
    blocks = {"op": "aten.cat.default", "args": [[_tensor_spec([1, 64])] * 6 + [_tensor_spec([0, 64])] * 2, 0],
              "kwargs": {}, "out": _tensor_spec([6, 64])}
    assert writes_nothing(empty) and not writes_nothing(blocks)
    assert not writes_nothing({"op": "aten.sum.default", "args": [], "kwargs": {}, "out": None})
    assert call_inputs(blocks) == [[[1, 64], [1, 64], [1, 64], [1, 64], "… 8 tensors"]]
    gate = {"ok": True, "queries": 2, "by_status": {}, "between_points": [], "failing": [],
            "writes_nothing": [{"op": "aten.cat.default", "status": "MISS", "calls": 54, "inputs": [[[0, 64]]],
                                "scenarios": ["m TP1 prefill:1"], "reason": "outside_axis_boundary"}]}
    assert gate_lines(gate)[1:] == [
        "1 distinct calls write nothing (every output has 0 elements: no kernel runs) and fall to msmodeling's "
        "roofline: it reads only positive latencies, so no row can answer them; they do not fail the check",
        "- aten.cat.default [[[0, 64]]] (54 calls; m TP1 prefill:1)"]


@needs_msmodeling
def test_the_grid_records_a_moe_model_at_its_expert_split_token_counts_too(tmp_path):
    """Between the points decode 2 and 4 (8 experts, top-2), batch 3 gives 2 experts no token: the recorder records
    it (at the smallest context) for its own rows; the gate's between-point scenario of the same text is not
    recorded twice."""
    from opperf.consumer.recorder import record_msmodeling_calls
    from opperf.devices import load_catalog, resolve_device

    (tmp_path / "scenarios.yaml").write_text(yaml.safe_dump({"spaces": {"moe": {
        "prefill_tokens": [16], "decode_batches": [2, 4], "decode_contexts": [256], "tp_sizes": [1]}}}))
    cpu = resolve_device("CPU", load_catalog())
    for between, names in ((False, ["prefill:16", "decode:2x256", "decode:4x256", "expert split decode:3x256"]),
                           (True, ["prefill:16", "decode:2x256", "decode:4x256", "between decode:3x256"])):
        recorded = record_msmodeling_calls(INSTALL, [str(TINY_GLM4_MOE)], REPO / "config" / "models.yaml",
                                           scenarios=tmp_path / "scenarios.yaml", space="moe", device=cpu,
                                           between_points=between, timeout_s=600)
        assert [scenario.name.split(" TP1 ")[1] for scenario in recorded] == names
        split = recorded[-1].calls
        blocks = [c for c in split if c["op"] == "aten.cat.default" and isinstance(c["args"][0], list)
                  and len(c["args"][0]) == EXPERTS]
        # 3 tokens x top-2 over 8 experts: 6 get one row, 2 none
        assert blocks and sorted(t["shape"][0] for t in blocks[0]["args"][0]) == [0, 0, 1, 1, 1, 1, 1, 1]
