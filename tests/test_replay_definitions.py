"""Kernel-definition schema: every shipped file loads; every mistake names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from opperf.errors import OpperfError
from opperf.replay.definitions import (DEFAULT_DEFINITIONS_DIR, definition_files, definition_for, definition_index,
                                       framework_op_mappings, load_definition, load_definitions)

ALL_FILES = definition_files(DEFAULT_DEFINITIONS_DIR)


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_definition_loads(path):
    definition = load_definition(path)
    assert definition.type == path.stem
    assert definition.api or definition.hook


def test_whole_tree_loads_and_types_are_unique_per_backend():
    # One Type may have a definition per family (TensorCast's MoeGatingTopK: torch_npu's kernel on npu, opperf's
    # computation on cpu/cuda); within a back end each Type has one, across the whole tree.
    families = [load_definitions(DEFAULT_DEFINITIONS_DIR / family) for family in ("torch", "npu")]
    assert sum(map(len, families)) == len(ALL_FILES)
    assert {Path(d.path) for backend in ("cpu", "cuda", "npu")
            for d in load_definitions(DEFAULT_DEFINITIONS_DIR, backend).values()} == set(ALL_FILES)
    assert {"MoeGatingTopK", "MoeTokenPermute", "MoeTokenUnpermute"} <= set(families[0]) & set(families[1])
    torch_defs = load_definitions(DEFAULT_DEFINITIONS_DIR / "torch", "cpu")
    assert {"mm", "add", "cat", "_scaled_dot_product_flash_attention_for_cpu"} <= set(torch_defs)
    assert all(d.supports("cpu") for d in torch_defs.values())


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


GOOD = {"type": "Foo", "backends": ["cpu"], "category": "matmul", "api": "torch.mm",
        "inputs": [{"role": "tensor"}, {"role": "tensor"}]}


@pytest.mark.parametrize("change, field", [
    ({"backends": ["tpu"]}, "backends"),
    ({"backends": []}, "backends"),
    ({"category": "magic"}, "category"),
    ({"api": None}, "api"),
    ({"api": "torch.mm(x)"}, "api"),
    ({"inputs": [{"role": "tensor", "colour": 1}]}, "inputs[0].colour"),
    ({"inputs": [{"role": "weights"}]}, "inputs[0].role"),
    ({"inputs": [{"role": "index"}]}, "inputs[0].high"),
    ({"inputs": [{"role": "index", "high": {"slot": 5, "dim": 0}}]}, "inputs[0].high.slot"),
    ({"inputs": [{"role": "scalar"}]}, "inputs[0]"),
    ({"inputs": [{"role": "tensor", "transpose": [0]}]}, "inputs[0].transpose"),
    ({"inputs": [{"role": "tensor", "optional": True}, {"role": "tensor"}]}, "inputs[1]"),
    ({"dtype_overrides": {7: "DT_INT8"}}, "dtype_overrides"),
    ({"dtype_overrides": {0: "DT_WHAT"}}, "dtype_overrides.0"),
    ({"kwargs": {"eps": {"nested": 1}}}, "kwargs.eps"),
    ({"outputs": {"verify": "yes"}}, "outputs.verify"),
    ({"memcpy_when_dense": "yes"}, "memcpy_when_dense"),
    ({"alternate_kernel_types": ["Foo"]}, "alternate_kernel_types"),
    ({"surprise": 1}, "surprise"),
    # overloads: each its own slot counts (a row's count picks its layout), its own inputs, never with a hook
    ({"overloads": [{"inputs": [{"role": "tensor"}, {"role": "tensor"}]}]}, "overloads[0].inputs"),
    ({"overloads": [{"inputs": [{"role": "tensor"}]},
                    {"inputs": [{"role": "tensor"}, {"role": "tensor", "optional": True}]}]}, "overloads[1].inputs"),
    ({"overloads": [{"api": "torch.mm"}]}, "overloads[0].inputs"),
    ({"overloads": [{"inputs": [{"role": "tensor"}], "colour": 1}]}, "overloads[0].colour"),
    ({"overloads": [{"inputs": [{"role": "weights"}]}]}, "overloads[0].inputs[0].role"),
    ({"overloads": [{"api": "torch.mm(x)", "inputs": [{"role": "tensor"}]}]}, "overloads[0].api"),
    ({"overloads": []}, "overloads"),
    ({"hook": "opperf.replay.schema", "overloads": [{"inputs": [{"role": "tensor"}]}]}, "overloads"),
])
def test_schema_errors_name_file_and_field(tmp_path, change, field):
    path = write(tmp_path, "Foo", yaml.safe_dump({**GOOD, **change}))
    with pytest.raises(OpperfError) as error:
        load_definition(path)
    assert error.value.field == field
    assert str(path) in str(error.value)
    assert error.value.row is not None          # the field's line, or its nearest parent's


def test_file_must_be_named_after_its_type(tmp_path):
    path = write(tmp_path, "Bar", yaml.safe_dump(GOOD))
    with pytest.raises(OpperfError, match="must be named Foo.yaml"):
        load_definition(path)


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "Foo", "type: Foo\nbackends: [cpu\n")
    with pytest.raises(OpperfError) as error:
        load_definition(path)
    assert error.value.row is not None and "not valid YAML" in str(error.value)


def test_a_type_claimed_twice_on_one_backend_is_an_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write(tmp_path / "a", "Foo", yaml.safe_dump({**GOOD, "alternate_kernel_types": ["Baz"]}))
    write(tmp_path / "b", "Baz", yaml.safe_dump({**GOOD, "type": "Baz"}))
    with pytest.raises(OpperfError, match="'Baz' on back end 'cpu' is already defined"):
        load_definitions(tmp_path)


def test_alternates_resolve_to_their_definition_and_feed_op_mapping(tmp_path):
    write(tmp_path, "Foo", yaml.safe_dump({**GOOD, "alternate_kernel_types": ["FooV3"],
                                           "framework_ops": ["aten.mm.default"]}))
    definitions = load_definitions(tmp_path)
    assert definition_for(definitions, "FooV3", "cpu").type == "Foo"
    assert definition_for(definitions, "FooV3", "cuda") is None
    assert definition_index(tmp_path) == {"Foo": tmp_path / "Foo.yaml", "FooV3": tmp_path / "Foo.yaml"}
    assert framework_op_mappings(definitions.values()) == [{
        "framework_op": "aten.mm.default", "kernel_type": "Foo", "alternate_kernel_types": ["FooV3"],
        "category": "matmul", "api": "torch.mm"}]


def test_heater_min_power_skips_the_heater_where_the_workload_ran_near_idle(tmp_path):
    """--heater-min-power W: no heater before a short call the workload ran while the GPU drew less than W (the
    reference MoE's expert loop at 134-174 W: benchmarks/results/heater_ab/); rows without a profiled power keep
    it unless --unprofiled-power gives them one, and the limit 0 heats every short call. The settings reach the
    worker's timer through its command line."""
    from types import SimpleNamespace

    from opperf import contract
    from opperf.power_samples import FIELDS
    from opperf.replay.isolation import WorkerSettings
    from opperf.replay.job import ReplaySettings
    from opperf.replay.timing import CudaTimer
    from opperf.replay.worker import build_parser

    assert contract.profiling_counter_column(FIELDS[1]) == contract.PROFILED_POWER

    def rested(limit, power, unprofiled=None):
        return CudaTimer.rested_in_workload(SimpleNamespace(heater_min_power_w=limit, unprofiled_power_w=unprofiled),
                                            SimpleNamespace(profiled_power_w=power))

    assert rested(180.0, 155.0) and not rested(180.0, 189.0) and not rested(180.0, None)
    assert not rested(0.0, 155.0)                                  # the default: every short call is heated
    # --unprofiled-power W: a row without a profiled power (a generated one) is taken at W; a profiled one keeps its own
    assert rested(180.0, None, 130.0) and not rested(180.0, None, 200.0) and not rested(180.0, 189.0, 130.0)
    command = WorkerSettings("rows.csv", "mul", "mul.yaml", "cuda", 30, 3, heater_min_power_w=180.0,
                             unprofiled_power_w=130.0).command(tmp_path / "indices", tmp_path / "progress")
    args = build_parser().parse_args(command[3:])
    assert (args.heater_min_power, args.unprofiled_power) == (180.0, 130.0)
    default = WorkerSettings("rows.csv", "mul", "mul.yaml", "cuda", 30, 3).command(tmp_path / "i", tmp_path / "p")
    assert build_parser().parse_args(default[3:]).unprofiled_power is None
    with pytest.raises(OpperfError, match="--heater-min-power"):
        ReplaySettings(backend="cuda", heater_min_power_w=-1.0).validate()
    with pytest.raises(OpperfError, match="--unprofiled-power"):
        ReplaySettings(backend="cuda", unprofiled_power_w=-5.0).validate()


def test_the_gemm_history_before_each_call_as_one_gemm():
    """The GEMM/attention history before each span, weighted by exp(-age / 25 ms), as the length of one GEMM
    ending at the span's start: a GEMM right before counts whole, one that ended earlier for less."""
    import math

    from opperf.power_samples import GEMM_STATE_TAU_US as TAU
    from opperf.power_samples import draws_power, gemm_time_before

    def equivalent(weight):
        return -TAU * math.log(1 - weight / TAU)

    def history(age_end, age_start):
        return TAU * (math.exp(-age_end / TAU) - math.exp(-age_start / TAU))

    spans = [(0.0, 46_000.0, 1.0), (46_000.0, 51_000.0, 0.0), (66_000.0, 67_000.0, 0.0),
             (67_000.0, 79_000.0, 1.0), (79_000.0, 80_000.0, 0.0), (400_000.0, 400_010.0, 0.0)]
    got = gemm_time_before(spans)
    assert got[0] == 0.0 and got[-1] == 0.0                              # no GEMM before; all of them too old
    assert got[1] == pytest.approx(46_000.0)                            # right after the 46 ms GEMM
    assert got[2] == pytest.approx(equivalent(history(20_000.0, 66_000.0)))       # it ended 20 ms before
    assert 11_000 < got[2] < 12_500
    assert got[4] == pytest.approx(equivalent(history(0.0, 12_000.0) + history(33_000.0, 79_000.0)))
    # A call at a fifth of the compute-bound rate counts a fifth of its time.
    weighted = gemm_time_before([(0.0, 46_000.0, 0.2), (46_000.0, 51_000.0, 0.0)])
    assert weighted[1] == pytest.approx(equivalent(0.2 * history(0.0, 46_000.0)))
    assert draws_power("aten::mm") and draws_power("aten::_scaled_dot_product_cudnn_attention")
    assert draws_power("aten::_grouped_mm") and not draws_power("aten::silu") and not draws_power("aten::cat")


def test_gemm_history_weights_follow_each_calls_flop_rate():
    """FLOPs from the trace's Input Dims, and a weight per call: its rate over the 90th percentile rate of the
    trace's 1 ms+ calls. The dense decoder's decode-size GEMM and its 34 ms memory-bound lm_head bmm count for
    little; the prefill GEMMs whole; an op that is not a GEMM for nothing; a GEMM of unknown FLOPs whole."""
    from opperf.power_samples import call_flops, power_weights

    assert call_flops("aten::mm", [[65536, 5120], [5120, 51200]]) == 2.0 * 65536 * 5120 * 51200
    assert call_flops("aten::addmm", [[51200], [64, 5120], [5120, 51200]]) == 2.0 * 64 * 5120 * 51200
    assert call_flops("aten::bmm", [[64, 1, 5120], [64, 5120, 151936]]) == 2.0 * 64 * 5120 * 151936
    assert call_flops("aten::_grouped_mm", [[4096, 4096], [8, 4096, 14336], [8]]) == 2.0 * 4096 * 4096 * 14336
    assert call_flops("aten::_cudnn_attention_forward", [[64, 64, 1, 128], [64, 8, 1025, 128], [64, 8, 1025, 128]]
                      ) == 4.0 * 64 * 64 * 128 * 1025
    assert call_flops("aten::_flash_attention_forward", [[1, 4096, 32, 128], [1, 4096, 8, 128]]
                      ) == 4.0 * 4096 * 32 * 128 * 4096
    assert call_flops("aten::silu", [[64, 1024, 25600]]) is None and call_flops("aten::mm", [[8]]) is None

    prefill = ("aten::mm", [[65536, 5120], [5120, 51200]], 45_005.5)        # 763 TFLOP/s: the reference
    down = ("aten::mm", [[65536, 25600], [25600, 5120]], 23_556.6)          # 729 TFLOP/s
    decode = ("aten::mm", [[64, 5120], [5120, 51200]], 191.0)               # 176 TFLOP/s
    lm_head = ("aten::bmm", [[64, 1, 5120], [64, 5120, 151936]], 34_303.1)  # 2.9 TFLOP/s
    weights = power_weights([prefill, down, decode, lm_head, ("aten::silu", [[64, 1024, 25600]], 5535.8),
                             ("aten::convolution", [[1, 3, 224, 224]], 50.0)])
    rate = call_flops(*prefill[:2]) / prefill[2]
    assert weights[0] == 1.0 and weights[1] == pytest.approx(call_flops(*down[:2]) / down[2] / rate)
    assert weights[2] == pytest.approx(call_flops(*decode[:2]) / decode[2] / rate) and 0.2 < weights[2] < 0.25
    assert weights[3] < 0.01 and weights[4] == 0.0 and weights[5] == 1.0
    # No call of 1 ms or more: the fastest call is the reference.
    assert power_weights([decode, ("aten::mm", [[8, 5120], [5120, 51200]], 187.5)])[0] == 1.0


def test_the_workflow_config_sets_the_unprofiled_power_and_refuses_a_negative_one(tmp_path):
    """config replay.unprofiled_power: null by default (generated rows heated); scripts/replay.py takes its default
    from there as the workflow passes it (rules/common.smk replay_power_options); a negative power is refused
    naming the key."""
    import importlib.util

    from opperf.workflow_defaults import WORKFLOW_CONFIG, workflow_defaults

    assert workflow_defaults("replay")["unprofiled_power"] is None
    spec = importlib.util.spec_from_file_location("replay_script", Path(WORKFLOW_CONFIG).parents[1] / "scripts" /
                                                  "replay.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.build_parser().parse_args([]).unprofiled_power is None
    assert script.build_parser().parse_args(["--unprofiled-power", "130"]).unprofiled_power == 130.0
    config = yaml.safe_load(Path(WORKFLOW_CONFIG).read_text())
    config["replay"]["unprofiled_power"] = 130
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(config))
    assert workflow_defaults("replay", tmp_path / "ok.yaml")["unprofiled_power"] == 130
    config["replay"]["unprofiled_power"] = -1
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(OpperfError, match="unprofiled_power"):
        workflow_defaults("replay", tmp_path / "bad.yaml")


def test_the_workload_power_is_the_call_weighted_median_of_the_profiled_rows_and_reaches_cuda_settings(tmp_path):
    """--unprofiled-power-from DIR (config replay.unprofiled_power: workload): generated rows are taken at the power
    the workload's own calls ran at, the call-weighted median over the parse stage's rows; rows without a power are
    left out; a directory with no power at all, or a power that is not a number, is refused naming the file, line
    and field. cpu ignores it (the heater is cuda's)."""
    import importlib.util
    import re

    from opperf import contract
    from opperf.replay.cli import settings_from_args, workload_power
    from opperf.workflow_defaults import WORKFLOW_CONFIG

    parsed = tmp_path / "parsed"
    parsed.mkdir()
    header = f"Type,{contract.PROFILING_SAMPLE_COUNT},{contract.PROFILED_POWER}\n"
    (parsed / "mm.csv").write_text(header + "mm,10,310.5\nmm,3,\n")
    (parsed / "silu.csv").write_text(header + "silu,12,128.0\nsilu,4,131.25\n")
    # 26 calls with a power: 128.0 (12), 131.25 (4), 310.5 (10); the 13th call's power is the median.
    assert workload_power(parsed) == (131.25, 26)
    (parsed / "silu.csv").write_text(header + "silu,20,128.0\nsilu,4,131.25\n")
    assert workload_power(parsed) == (128.0, 34)

    spec = importlib.util.spec_from_file_location("replay_script", Path(WORKFLOW_CONFIG).parents[1] / "scripts" /
                                                  "replay.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = script.build_parser().parse_args(["--backend", "cuda", "--unprofiled-power-from", str(parsed)])
    assert settings_from_args(args, None).unprofiled_power_w == 128.0
    args = script.build_parser().parse_args(["--backend", "cpu", "--unprofiled-power-from", str(tmp_path / "none")])
    assert settings_from_args(args, None).unprofiled_power_w is None
    both = script.build_parser().parse_args(["--backend", "cuda", "--unprofiled-power", "130",
                                             "--unprofiled-power-from", str(parsed)])
    with pytest.raises(OpperfError, match="not both"):
        settings_from_args(both, None)

    (parsed / "mm.csv").write_text(header + "mm,10,hot\n")
    with pytest.raises(OpperfError, match=re.escape(f"mm.csv, line 2, field '{contract.PROFILED_POWER}': not a number: 'hot'")):
        workload_power(parsed)
    (parsed / "mm.csv").write_text(header + "mm,10,\n")
    (parsed / "silu.csv").unlink()
    with pytest.raises(OpperfError, match="no row has a Profiling Average Power"):
        workload_power(parsed)
    with pytest.raises(OpperfError, match="no kernel CSV"):
        workload_power(tmp_path / "none")
