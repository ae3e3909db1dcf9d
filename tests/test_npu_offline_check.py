"""The offline NPU check: every definition bound to torch_npu's real schemas and run on its meta kernels.

The torch_npu 2.9.0 and vllm-ascend 0.18.0 wheels are downloaded once with pip into .cache/torch_npu (gitignored)
and read as zips;
the check runs as the CLI does, in a subprocess (its torch.library registrations are process-wide).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from opperf.coverage import coverage, load_not_replayed, observed_kernel_types
from opperf.replay.definitions import load_definitions
from opperf.replay.npu.offline_check import bind_problem

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "check_npu_definitions.py"
WHEEL_CACHE = REPO / ".cache" / "torch_npu"
VERSION_DIR = "vllm0.18.0_torch2.9.0_cann8.5"


def _run(tmp_path: Path, definitions: Path = REPO / "config" / "kernels" / "npu") -> tuple[int, str, str]:
    output = tmp_path / "check.md"
    completed = subprocess.run([sys.executable, str(SCRIPT), "--version-dir", VERSION_DIR, "--wheel-cache",
                                str(WHEEL_CACHE), "--profiles", str(REPO / "resources" / "profiles"),
                                "--example-rows", str(REPO / "tests" / "data" / "replay_npu" / "example_rows.csv"),
                                "--definitions", str(definitions), "--output", str(output)],
                               capture_output=True, text=True, timeout=1200, cwd=REPO)
    report = output.read_text() if output.exists() else ""
    return completed.returncode, report, completed.stderr


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("check"))


def _row(report: str, name: str) -> list[str]:
    line = next(line for line in report.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_every_shipped_definition_binds_and_verifies(shipped):
    returncode, report, stderr = shipped
    assert returncode == 0, stderr
    # Real profiled rows (resources/profiles, the A3 kernel_details): bound and shape-verified on meta tensors.
    assert _row(report, "Add")[1:] == ["`torch.add`", "2/2 / 2/2 / 0", "1/1 / 1/1 / 0", "shape-verified"]
    assert _row(report, "FlashAttentionScore")[1:3] == ["`npu::npu_fusion_attention.default`", "1/2 / 1/2 / 1"]
    assert _row(report, "FlashAttentionScore")[-1] == "shape-verified (1 profiled rows unbuildable, see below)"
    assert _row(report, "FlashAttentionScoreGrad")[2] == "1/1 / 1/1 / 0"
    # torch_npu schemas + meta kernels, example rows.
    assert _row(report, "RmsNorm")[1:] == ["`npu::npu_rms_norm.default`", "-", "1/1 / 1/1 / 0", "shape-verified"]
    assert _row(report, "FusedInferAttentionScore")[3] == "2/2 / 2/2 / 0"
    assert _row(report, "LightningIndexer")[-1] == "shape-verified"
    assert _row(report, "SparseFlashAttention")[-1] == "shape-verified"
    assert "RINGMLAPrefillBF16Kernel" in report.split("Definitions not checked")[1].splitlines()[0]  # not in 0.18
    # vLLM-Ascend 0.18.0's own ops: _C_ascend schemas bind; the `vllm` Triton op runs its fake on meta tensors.
    assert _row(report, "AddRmsNormBias")[1:] == ["`_C_ascend::npu_add_rms_norm_bias.default`", "-", "1/1 / 0/1 / 0",
                                                  "schema-bound (no meta kernel)"]
    assert _row(report, "DispatchFFNCombine")[1] == "`_C_ascend::dispatch_ffn_combine.default`"
    assert _row(report, "split_qkv_rmsnorm_rope_kernel")[1:] == ["`vllm::qkv_rmsnorm_rope.default`", "-",
                                                                 "1/1 / 1/1 / 0", "shape-verified"]
    # The real fixture's inconsistent rows are reported with their reason, not hidden.
    assert "kernel_details.csv:22 [build_error]" in report and "not a multiple of the 3 heads" in report
    assert "kernel_details.csv:2 [build_error]" in report and "do not multiply" in report


def test_a_wrong_keyword_and_a_wrong_output_are_caught(tmp_path):
    definitions = tmp_path / "npu"
    shutil.copytree(REPO / "config" / "kernels" / "npu", definitions)
    rms = yaml.safe_load((definitions / "RmsNorm.yaml").read_text())
    rms["kwargs"] = {"eps": 1.0e-6}                       # torch_npu names it `epsilon`
    (definitions / "RmsNorm.yaml").write_text(yaml.safe_dump(rms))
    swiglu = yaml.safe_load((definitions / "SwiGlu.yaml").read_text())
    swiglu["kwargs"] = {"dim": 0}                         # halves the wrong dimension
    (definitions / "SwiGlu.yaml").write_text(yaml.safe_dump(swiglu))
    returncode, report, stderr = _run(tmp_path, definitions)
    assert returncode == 1
    assert "RmsNorm" in stderr and "[bind_error] npu::npu_rms_norm.default: no argument named 'eps'" in stderr
    assert "SwiGlu" in stderr and "[mismatch] output slot 0: shape [8, 1024] != expected [16, 512]" in stderr
    assert _row(report, "RmsNorm")[-1] == "FAILED"


def test_binding_names_what_does_not_fit():
    schema = torch._C.parse_schema("npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
                                   "ScalarType? output_dtype=None, SymInt[]? group_sizes=None) -> Tensor")
    x = torch.empty(2, 2, device="meta")
    assert bind_problem(schema, (x, x, x), {"output_dtype": torch.bfloat16}) is None
    assert bind_problem(schema, (x, x), {}) == "required argument 'scale' (Tensor) missing"
    assert bind_problem(schema, (x, x, x, x), {}) == "4 positional arguments, the schema takes 3"
    assert bind_problem(schema, (x, x, x), {"output_dtype": "bf16"}) == \
        "argument 'output_dtype' expects Optional[ScalarType], got str"
    assert bind_problem(schema, (x, x, 1.0), {}) == "argument 'scale' expects Tensor, got float"


def test_every_observed_ascend_kernel_type_is_defined_or_listed_with_a_reason():
    definitions = load_definitions(REPO / "config" / "kernels" / "npu", backend="npu")
    observed = observed_kernel_types()
    assert len(observed) == 116
    result = coverage(observed, definitions, load_not_replayed()["npu"])
    unaccounted = [c.kernel_type for c in result if c.definition is None and c.not_replayed is None]
    assert unaccounted == []
    defined = [c for c in result if c.definition]
    assert len(defined) == 102
    by_type = {c.kernel_type: c for c in result}
    assert by_type["AddAiCore"].definition == "Add" and by_type["MatMulCommon"].definition == "MatMulV2"
    assert by_type["reduce_scatterAicpuKernel"].not_replayed.reason == "communication"
    assert by_type["MemSet"].not_replayed.reason == "runtime_internal"
