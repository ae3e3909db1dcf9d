"""The bad-input and fault corpus of issue 16: each case, what it does to a fresh copy of the workflow, the command
a user would run, and the one line it must be refused with.

Two drivers run it: tests/test_bad_input_corpus.py (in-process where it can, so CI stays fast: the workflow's
load-time check through the same calls the Snakefile makes, scripts through `run_cli`) and
benchmarks/bad_inputs.py (every case as a user meets it: `snakemake -n` and `python scripts/...`, outcomes
tabulated). Cases with an OS fault always run as a child process under tests/faults.py.

A case's `expect` is the line without its `error: ` prefix, with paths as the user gave them (relative to
the workflow copy). `None` means the command must succeed (kill-and-rerun cases); their `check` says what
must hold afterwards (no temporary left, no row lost or counted twice).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTCOMES = ("ok", "traceback", "unclear", "accepted-wrong", "left-behind", "counted-twice", "rows-lost")
A3_PROFILE = "resources/profiles/A3_vllm0.18.0_torch2.9.0_cann8.5/kernel_details.csv"
A3_DIR = "resources/profiles/A3_vllm0.18.0_torch2.9.0_cann8.5"
A3_VERSION = "vllm0.18.0_torch2.9.0_cann8.5"
SOURCES_HEADER = "device\tstack\tversion_dir\tpath\n"
MODELS_KNOWN = "DeepSeek-V3, Llama-3-70B, Qwen2.5-7B, Qwen3-235B-A22B, Qwen3-32B, opperf-tiny"
DEVICES_KNOWN = "A2, A3, CPU, H100, H200"


def _schema_keys(name: str, *path: str) -> str:
    """The allowed keys of a schema node, as the one-line error lists them (so the corpus follows the schema)."""
    import yaml

    node = yaml.safe_load((REPO / "config" / name).read_text(encoding="utf-8"))
    for key in path:
        node = node[key]
    return ", ".join(sorted(node["properties"]))


CONFIG_KEYS = _schema_keys("config.schema.yaml")
REPLAY_KEYS = _schema_keys("config.schema.yaml", "properties", "replay")
GRID_KEYS = _schema_keys("config.schema.yaml", "properties", "grid")
DEVICE_FIELDS = _schema_keys("devices.schema.yaml", "additionalProperties")
MODEL_FIELDS = _schema_keys("models.schema.yaml", "additionalProperties")


def _definition_keys() -> str:
    from opperf.replay.definitions import _TOP_KEYS

    return repr(sorted(_TOP_KEYS))


def _pattern_keys() -> str:
    from opperf.grid.config import _PATTERN_KEYS

    return ", ".join(sorted(_PATTERN_KEYS))


@dataclass(frozen=True)
class Case:
    name: str
    group: str                                     # what kind of input: config, catalog, models, grid, ...
    prepare: Callable[[Path], None]                # edits the fresh workflow copy
    expect: str | Callable[[Path], str] | None     # the one error line (see module docstring)
    command: tuple[str, ...] = ()                  # a script's argv; () = the workflow's load-time check
    configfiles: tuple[str, ...] = ()              # extra --configfile files (workflow cases)
    fault: str | None = None                       # tests/faults.py fault on `fault_dir`
    fault_dir: str = "out"
    check: Callable[[Path], list[str]] | None = None   # problems left after the run (rows lost, counted twice)
    note: str = ""
    tags: tuple[str, ...] = field(default=())

    def expected(self, root: Path) -> str | None:
        return self.expect(root) if callable(self.expect) else self.expect


# --- preparing a copy -----------------------------------------------------------------------------

def edit(relative: str, old: str, new: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / relative
        text = path.read_text(encoding="utf-8")
        if old not in text:
            raise AssertionError(f"corpus: {old!r} is not in {relative}")
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return apply


def write(relative: str, content: str | bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return apply


def both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        for step in steps:
            step(root)
    return apply


def nothing(root: Path) -> None:
    pass


def line_with(relative: str, text: str) -> Callable[[Path], int]:
    def find(root: Path) -> int:
        for number, line in enumerate((root / relative).read_text(encoding="utf-8").splitlines(), start=1):
            if text in line:
                return number
        raise AssertionError(f"corpus: {text!r} is not in {relative}")
    return find


def at(relative: str, text: str, message: str) -> Callable[[Path], str]:
    """`{relative}, line N, {message}` with N the line holding `text` after the edit (`{root}/` in `relative`: the
    copy's path, where a script names a file in full)."""
    name = relative.removeprefix("{root}/")
    where = line_with(name, text)
    return lambda root: f"{relative.replace('{root}', str(root))}, line {where(root)}, {message}"


def unclosed(relative: str, found_at: str, started_at: str, *, flow: str = "mapping",
             full_path: bool = False) -> Callable[[Path], str]:
    """YAML's one line for a flow mapping/sequence left open: where it gave up, and where the flow started."""
    closer = "}" if flow == "mapping" else "]"

    def line(root: Path) -> str:
        shown = f"{root}/{relative}" if full_path else relative
        return (f"{shown}, line {line_with(relative, found_at)(root)}: not valid YAML: did not find expected ',' or "
                f"'{closer}' (while parsing a flow {flow} started at line {line_with(relative, started_at)(root)})")
    return line


def sources(*rows: tuple[str, str, str, str]) -> Callable[[Path], None]:
    return write("config/sources.tsv", SOURCES_HEADER + "".join("\t".join(r) + "\n" for r in rows))


def a3_row(path: str = A3_PROFILE) -> tuple[str, str, str, str]:
    return ("A3", "vllm_ascend", A3_VERSION, path)


def copy_in(source: Path, relative: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, root / relative)
    return apply


def replay_rows(relative: str = "in/mm.csv", kernel: str = "mm", count: int = 2) -> Callable[[Path], None]:
    """A small rows CSV of one CPU kernel type (from tests/data/replay/cpu_rows.csv)."""
    def apply(root: Path) -> None:
        import csv

        with open(REPO / "tests" / "data" / "replay" / "cpu_rows.csv", newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = [r for r in reader if r["Type"] == kernel][:count]
        columns = [c for c in reader.fieldnames if c != "Type"]
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    return apply


def definition(relative: str, replace: tuple[str, str] | None = None, add: str = "",
               source: str = "config/kernels/torch/mm.yaml") -> Callable[[Path], None]:
    """A copy of a shipped kernel definition with one line changed or added."""
    def apply(root: Path) -> None:
        text = (root / source).read_text(encoding="utf-8")
        if replace is not None:
            assert replace[0] in text, replace
            text = text.replace(*replace)
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text + add, encoding="utf-8")
    return apply


def not_utf8(relative: str, source: Path, line: int, column_value: str) -> Callable[[Path], None]:
    """A copy of a CSV whose `line` has a Latin-1 byte inside the value `column_value`."""
    def apply(root: Path) -> None:
        lines = source.read_bytes().split(b"\n")
        assert column_value.encode() in lines[line - 1], (column_value, lines[line - 1])
        lines[line - 1] = lines[line - 1].replace(column_value.encode(), column_value.encode() + b"\xe9", 1)
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(b"\n".join(lines))
    return apply


def parsed_a3(relative: str = "parsed") -> Callable[[Path], None]:
    """The parse stage's output for the shipped A3 profile (input to the database and grid stages)."""
    def apply(root: Path) -> None:
        done = subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", A3_PROFILE,
                               "--database-path", relative], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return apply


# --- kill-and-rerun: a writer killed mid-write, then the same job again -------------------------------

def killed_writer(target: str, kind: str = "file") -> Callable[[Path], None]:
    """Leave what a run SIGKILLed in the middle of writing `target` leaves: a real opperf writer (atomic_output or
    staged_directory) killed by SIGKILL with its temporary half written."""
    def apply(root: Path) -> None:
        body = ("handle.write('half a row,')" if kind == "file" else
                "(handle / 'MatMulV2.csv').write_text('Type,half')")
        opener = "atomic_output" if kind == "file" else "staged_directory"
        code = (f"import os, signal\nfrom opperf.io import {opener}\n"
                f"with {opener}({target!r}) as handle:\n    {body}\n    os.kill(os.getpid(), signal.SIGKILL)\n")
        done = subprocess.run([sys.executable, "-c", code], cwd=root, env=_env(), capture_output=True, text=True)
        assert done.returncode == -signal.SIGKILL, done.stderr
        assert stale_temporaries(root), "the killed writer left no temporary"
    return apply


def legacy_temporary(target: str) -> Callable[[Path], None]:
    """A temporary named as before writers were tagged (`.{name}.XXXXXXXX.tmp`), from an older opperf."""
    def apply(root: Path) -> None:
        path = root / target
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / f".{path.name}.k3x9_a1b.tmp").write_text("half")
    return apply


def live_writer(target: str) -> Callable[[Path], None]:
    """A temporary of a writer that is still running (this test's own process stands in for it)."""
    def apply(root: Path) -> None:
        from opperf.io import temp_prefix

        path = root / target
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / f"{temp_prefix(path)}live0001.tmp").write_text("being written")
    return apply


def stale_temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp") if ".snakemake" not in p.parts)


def no_temporaries_except_live(root: Path) -> list[str]:
    left = [p for p in stale_temporaries(root) if "live0001" not in p]
    live = [p for p in stale_temporaries(root) if "live0001" in p]
    return ([f"left behind: {p}" for p in left] +
            ([] if live else ["a live writer's temporary was removed"]))


def rows_match_one_parse(database: str) -> Callable[[Path], list[str]]:
    """After the rerun: no temporary left, and every kernel CSV has the sample counts of one clean parse."""
    def check(root: Path) -> list[str]:
        problems = [f"left behind: {p}" for p in stale_temporaries(root)]
        reference = root.parent / f"{root.name}-reference"
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"), "--profiling-path",
                               str(REPO / A3_PROFILE), "--database-path", str(reference)], capture_output=True,
                              text=True, env=_env())
        assert done.returncode == 0, done.stderr
        for expected in sorted(reference.glob("*.csv")):
            got = root / database / expected.name
            if not got.is_file():
                problems.append(f"rows lost: {got.relative_to(root)} missing")
            elif _sample_total(got) != _sample_total(expected):
                problems.append(f"{got.relative_to(root)}: {_sample_total(got)} samples, one parse gives "
                                f"{_sample_total(expected)}")
        shutil.rmtree(reference, ignore_errors=True)
        return problems
    return check


def _sample_total(path: Path) -> int:
    import csv

    with open(path, newline="", encoding="utf-8") as handle:
        return sum(int(r.get("Profiling Sample Count") or 0) for r in csv.DictReader(handle))


def no_temporaries(root: Path) -> list[str]:
    return [f"left behind: {p}" for p in stale_temporaries(root)]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# --- the cases --------------------------------------------------------------------------------------

CFG = "config/config.yaml"
DEV = "config/devices.yaml"
MOD = "config/models.yaml"
GRID = "config/grid.yaml"
SRC = "config/sources.tsv"
MM = "config/kernels/torch/mm.yaml"
PARSE = ("scripts/parse_kernel_details.py", "--profiling-path")
KERNEL_CSV = "parsed/MatMulV2.csv"


def _cases() -> list[Case]:
    cases = [
        # --- config.yaml (validated against config/config.schema.yaml when the workflow loads) ---
        Case("config: YAML syntax error", "config", edit(CFG, "workload:\n", "workload: {x\n"),
             unclosed(CFG, "  enabled: true", "workload: {x")),
        Case("config: tab indentation", "config", edit(CFG, "  backend: cpu ", "\tbackend: cpu "),
             lambda root: f"{CFG}, line {line_with(CFG, 'backend: cpu')(root)}: not valid YAML: found a tab character "
                          f"that violates indentation (while scanning a plain scalar started at line "
                          f"{line_with(CFG, 'backend: cpu')(root) - 1})"),
        Case("config: unknown top-level key (replays:)", "config", edit(CFG, "\nreplay:\n", "\nreplays:\n"),
             at(CFG, "replays:", f"field 'replays': unknown key 'replays'; allowed: {CONFIG_KEYS}")),
        Case("config: unknown nested key", "config", edit(CFG, "  repeat_count: 10", "  repeat_cont: 10"),
             at(CFG, "repeat_cont:", f"field 'replay.repeat_cont': unknown key 'repeat_cont'; allowed: {REPLAY_KEYS}")),
        Case("config: wrong type", "config", edit(CFG, "  repeat_count: 10", "  repeat_count: ten"),
             at(CFG, "repeat_count: ten", "field 'replay.repeat_count': must be an integer, got 'ten'")),
        Case("config: out of range", "config", edit(CFG, "  rows: 0 ", "  rows: -1 "),
             at(CFG, "rows: -1", "field 'grid.rows': must be >= 0, got -1")),
        Case("config: not one of the choices", "config", edit(CFG, "  backend: cpu ", "  backend: tpu "),
             at(CFG, "backend: tpu", "field 'workload.backend': must be one of cpu, cuda, npu; got 'tpu'")),
        Case("config: no models key", "config", edit(CFG, "models: config/models.yaml\n", ""),
             f"{CFG}, field 'models': missing (required)"),
        Case("config: no sources key", "config", edit(CFG, "sources: config/sources.tsv\n", ""),
             f"{CFG}, field 'sources': missing (required)"),
        Case("config: unknown workload.model", "config", edit(CFG, "model: opperf-tiny ", "model: opperf-tiney "),
             at(CFG, "model: opperf-tiney", f"field 'workload.model': unknown model 'opperf-tiney' in {MOD}; "
                f"closest: opperf-tiny; known: {MODELS_KNOWN} (or their aliases; case and punctuation are ignored)")),
        Case("config: unknown grid target model", "config", edit(CFG, "cuda: [Llama-3-70B,", "cuda: [Llama-3-7B,"),
             at(CFG, "cuda: [Llama-3-7B", f"field 'grid.target_models.cuda[0]': unknown model 'Llama-3-7B' in "
                f"{MOD}; closest: Llama-3-70B; known: {MODELS_KNOWN} (or their aliases; case and punctuation are "
                "ignored)")),
        Case("config: a predicted scenario that is no scenario", "config",
             edit(CFG, "cpu: [prefill:16, prefill:32,", "cpu: [prefill:16k, prefill:32,"),
             at(CFG, "cpu: [prefill:16k", "field 'predict.scenarios.cpu[0]': not a scenario: 'prefill:16k' "
                "(prefill:TOKENS or decode:BATCHxCONTEXT, e.g. prefill:1536, decode:16x1024)")),
        Case("config: a predicted scenario of no tokens", "config",
             write("my.yaml", "predict:\n  scenarios: [prefill:16, decode:4x0]\n"),
             "my.yaml, line 2, field 'predict.scenarios[1]': 'decode:4x0': CONTEXT must be >= 1, got 0 "
             "(prefill:TOKENS or decode:BATCHxCONTEXT, e.g. prefill:1536, decode:16x1024)", configfiles=("my.yaml",)),
        Case("config: a list entry of the wrong type", "config",
             write("my.yaml", "grid:\n  target_models:\n    - opperf-tiny\n    - {cpu: opperf-tiny}\n"),
             "my.yaml, line 4, field 'grid.target_models[1]': must be a string, got {'cpu': 'opperf-tiny'}",
             configfiles=("my.yaml",)),
        Case("config: unknown workload device", "config", edit(CFG, "  device: CPU           #", "  device: GPU    #"),
             at(CFG, "device: GPU", f"field 'workload.device': device 'GPU' is not in {DEV} (known: {DEVICES_KNOWN})")),
        Case("config: unknown comm device", "config", edit(CFG, "  device: CPU                #", "  device: CPUS #"),
             at(CFG, "device: CPUS", f"field 'comm.device': device 'CPUS' is not in {DEV} (known: {DEVICES_KNOWN})")),
        Case("config: a list, not a mapping", "config", write(CFG, "- sources: config/sources.tsv\n"),
             f"{CFG}, line 1: the workflow config must be a mapping at the top level, got list"),
        Case("config: empty file", "config", write(CFG, "# nothing yet\n"),
             f"{CFG}, line 1: the workflow config must be a mapping at the top level, got an empty file"),
        Case("config: --configfile sets a bad value", "config",
             write("my.yaml", "replay:\n  timeout_s: 0\n"), "my.yaml, line 2, field 'replay.timeout_s': must be > 0, got 0",
             configfiles=("my.yaml",)),
        Case("config: --configfile with a typo'd key", "config",
             write("my.yaml", "grid:\n  target_model: [opperf-tiny]\n"),
             f"my.yaml, line 2, field 'grid.target_model': unknown key 'target_model'; allowed: {GRID_KEYS}",
             configfiles=("my.yaml",)),
        Case("config: workload.version_dir of another form", "config",
             write("my.yaml", "workload:\n  version_dir: torch2.13_cpu-mine\n"),
             "my.yaml, line 2, field 'workload.version_dir': version directory 'torch2.13_cpu-mine' is not of the form "
             "vllm<v>_torch<t>_cann<c>, vllm<v>_torch<t>_cuda<c> or torch<t>_cpu (optionally with _<suffix>)",
             configfiles=("my.yaml",)),
        Case("config: comm.version_dir of another back end", "config",
             write("my.yaml", "comm:\n  version_dir: nccl2.28.9_torch2.11.0_cuda13.0\n"),
             "my.yaml, line 2, field 'comm.version_dir': gloo version directory 'nccl2.28.9_torch2.11.0_cuda13.0' is "
             "not of the form torch<t> (gloo ships inside torch), e.g. torch2.13.0", configfiles=("my.yaml",)),
        Case("config: devices file missing", "config", edit(CFG, "devices: config/devices.yaml", "devices: config/device.yaml"),
             "config/device.yaml: the device catalog does not exist"),
        # --- the device catalog ---
        Case("devices: memory_gb: lots", "catalog", edit(DEV, "memory_gb: 64", "memory_gb: lots"),
             at(DEV, "memory_gb: lots", "field 'A2.memory_gb': must be a number, got 'lots'")),
        Case("devices: memory_gb: -16", "catalog", edit(DEV, "memory_gb: 64", "memory_gb: -16"),
             at(DEV, "memory_gb: -16", "field 'A2.memory_gb': must be > 0, got -16")),
        Case("devices: unknown back end", "catalog", edit(DEV, "backend: npu", "backend: tpu"),
             at(DEV, "backend: tpu", "field 'A2.backend': must be one of cpu, cuda, npu; got 'tpu'")),
        Case("devices: a required field missing", "catalog", edit(DEV, "  full_name: GENERIC_HOST_CPU\n", ""),
             at(DEV, "CPU:", "field 'CPU.full_name': missing (required)")),
        Case("devices: typo'd field", "catalog", edit(DEV, "  memory_bandwidth_gbps: 50\n", "  memory_bandwith_gbps: 50\n"),
             at(DEV, "memory_bandwith_gbps", "field 'CPU.memory_bandwith_gbps': unknown key 'memory_bandwith_gbps'; "
                f"allowed: {DEVICE_FIELDS}")),
        Case("devices: YAML syntax error", "catalog", edit(DEV, "  peak_tflops: {bfloat16: 1, float16: 1, float32: 1}",
                                                           "  peak_tflops: {bfloat16: 1, float16: 1, float32: 1"),
             unclosed(DEV, "memory_bandwidth_gbps: 50", "float32: 1")),
        Case("devices: peak_tflops negative", "catalog", edit(DEV, "float32: 1}", "float32: -1}"),
             at(DEV, "float32: -1}", "field 'CPU.peak_tflops.float32': must be > 0, got -1")),
        # --- models.yaml ---
        Case("models: num_key_value_heads: -4", "models", edit(MOD, "num_key_value_heads: 4\n", "num_key_value_heads: -4\n"),
             at(MOD, "num_key_value_heads: -4", "field 'opperf-tiny.num_key_value_heads': must be >= 1, got -4")),
        Case("models: hidden_size: '256x'", "models", edit(MOD, "hidden_size: 256\n", "hidden_size: '256x'\n"),
             at(MOD, "hidden_size: '256x'", "field 'opperf-tiny.hidden_size': must be an integer, got '256x'")),
        Case("models: typo'd field", "models", edit(MOD, "  rope_theta: 10000.0\n", "  rope_theata: 10000.0\n"),
             at(MOD, "rope_theata", f"field 'opperf-tiny.rope_theata': unknown key 'rope_theata'; allowed: "
                f"{MODEL_FIELDS}")),
        Case("models: TP size that does not divide the heads", "models", edit(MOD, "tp_sizes: [1, 2]\n", "tp_sizes: [1, 3]\n"),
             at(MOD, "tp_sizes: [1, 3]", "field 'opperf-tiny.tp_sizes': model 'opperf-tiny': TP size 3 does not "
                "divide num_attention_heads 8")),
        Case("models: YAML syntax error", "models", edit(MOD, "  tp_sizes: [1, 2]\n", "  tp_sizes: [1, 2\n"),
             unclosed(MOD, "Qwen3-32B:", "tp_sizes: [1, 2", flow="sequence")),
        # --- grid.yaml ---
        Case("grid.yaml: YAML syntax error", "grid", edit(GRID, "  small_batch: [1, 2, 4]", "  small_batch: [1, 2, 4"),
             unclosed(GRID, "  kv_cache_blocks: [256", "small_batch", flow="sequence")),
        Case("grid.yaml: typo'd pattern key", "grid", edit(GRID, '    outputs: ["m, n"]\n', '    output: ["m, n"]\n'),
             lambda root: at(GRID, 'output: ["m, n"]', "field 'patterns.gemm.output': pattern 'gemm': unknown key "
                             f"'output' (allowed: {_pattern_keys()})")(root)),
        # --- kernel definitions ---
        Case("definition: YAML syntax error", "definitions", edit(MM, "  - {role: tensor}\n", "  - {role: tensor\n"),
             unclosed(MM, "cache: cold", "{role: tensor")),
        Case("definition: unknown key", "definitions", edit(MM, "category: matmul", "category: matmul\nhok: x"),
             lambda root: at(MM, "hok: x", f"field 'hok': unknown key(s) ['hok']; allowed: {_definition_keys()}")(root)),
        Case("definition: bad role", "definitions", edit(MM, "  - {role: tensor}\n", "  - {role: tensr}\n"),
             at(MM, "role: tensr", "field 'inputs[0].role': role 'tensr' is not one of ('tensor', 'index', 'scalar', "
                "'device', 'dtype', 'none')")),
        # --- the sources sheet ---
        Case("sources: the same profile twice", "sources", sources(a3_row(), a3_row()),
             f"{SRC}, line 3, field 'path': '{A3_PROFILE}' is the same profile as line 2 ('{A3_PROFILE}') of "
             f"database A3/vllm_ascend/{A3_VERSION}: its launches would be counted twice; keep one of the lines",
             tags=("counted-twice",)),
        Case("sources: the same profile via another relative path", "sources",
             sources(a3_row(), a3_row("./resources/../" + A3_PROFILE)),
             f"{SRC}, line 3, field 'path': './resources/../{A3_PROFILE}' is the same profile as line 2 "
             f"('{A3_PROFILE}') of database A3/vllm_ascend/{A3_VERSION}: its launches would be counted twice; "
             "keep one of the lines", tags=("counted-twice",)),
        Case("sources: a directory and a file inside it", "sources", sources(a3_row(A3_DIR), a3_row()),
             f"{SRC}, line 3, field 'path': '{A3_PROFILE}' overlaps line 2 ('{A3_DIR}') of database "
             f"A3/vllm_ascend/{A3_VERSION}: its launches would be counted twice; keep one of the lines",
             tags=("counted-twice",)),
        Case("sources: unknown device", "sources", sources(("B200", "vllm_ascend", A3_VERSION, A3_PROFILE)),
             f"{SRC}, line 2, field 'device': 'B200' is not in {DEV} (known: {DEVICES_KNOWN})"),
        Case("sources: profile path does not exist", "sources", sources(a3_row("resources/nowhere.csv")),
             f"{SRC}, line 2, field 'path': 'resources/nowhere.csv' does not exist"),
        Case("sources: bad version_dir", "sources", sources(("A3", "vllm_ascend", "latest", A3_PROFILE)),
             f"{SRC}, line 2, field 'version_dir': version directory 'latest' is not of the form vllm<v>_torch<t>_"
             "cann<c>, vllm<v>_torch<t>_cuda<c> or torch<t>_cpu (optionally with _<suffix>)"),
        Case("sources: empty field", "sources", sources(("A3", "", A3_VERSION, A3_PROFILE)),
             f"{SRC}, line 2, field 'stack': empty or missing"),
        Case("sources: not UTF-8", "sources",
             write(SRC, (SOURCES_HEADER.replace("\n", "\tnote\n") + "\t".join(a3_row()) + "\tnot\xe9\n"
                         ).encode("latin-1")),
             f"{SRC}, line 2, field 'note': not UTF-8 text: byte 0xe9 in column 5"),
        Case("sources: sheet missing", "sources", edit(CFG, "sources: config/sources.tsv", "sources: config/source.tsv"),
             "config/source.tsv: sources sheet not found (config key 'sources')"),
    ]
    cases += _script_cases()
    return cases


def _script_cases() -> list[Case]:
    parse = (*PARSE, A3_PROFILE, "--database-path", "out/parsed")
    kernel = ("scripts/build_database.py", "kernel", "--rows", KERNEL_CSV, "--kernel", "MatMulV2",
              "--output", "out/MatMulV2.csv")
    replay_mm = ("scripts/replay.py", "--rows", "in/mm.csv", "--kernel", "mm", "--backend", "cpu",
                 "--definition", "defs/mm.yaml", "--output", "out/mm.csv", "--trace-dir", "out/traces",
                 "--repeat-count", "1", "--warmup-count", "1", "--timeout-s", "120")
    grid = ("scripts/generate_shape_grid.py", "--input-dir", "parsed", "--output-dir", "out/grid", "--device", "A3",
            "--rows", "4")
    workload = ("scripts/profile_workload.py", "--model", "opperf-tiny", "--num-layers", "1", "--prefill-lengths", "4",
                "--decode-steps", "1", "--decode-context", "4", "--output", "out/profile")
    cases = [
        # --- CSV content ---
        Case("parse: a data row not UTF-8", "csv", not_utf8("in/kernel_details.csv", REPO / A3_PROFILE, 5, "dynamic"),
             "in/kernel_details.csv, line 5, field 'OP State': not UTF-8 text: byte 0xe9 in column 7",
             command=(*PARSE, "in/kernel_details.csv", "--database-path", "out/parsed")),
        Case("parse: the header not UTF-8", "csv", not_utf8("in/kernel_details.csv", REPO / A3_PROFILE, 1, "Input Shapes"),
             "in/kernel_details.csv, line 1: not UTF-8 text: byte 0xe9 in column 15",
             command=(*PARSE, "in/kernel_details.csv", "--database-path", "out/parsed")),
        Case("parse: the same profile twice", "csv", nothing,
             f"{A3_PROFILE}, field '--profiling-path': the same profile is given twice: its launches would be counted "
             "twice", command=(*PARSE, A3_PROFILE, "./" + A3_PROFILE, "--database-path", "out/parsed"),
             tags=("counted-twice",)),
        Case("parse: a directory and a file in it", "csv", nothing,
             f"{A3_PROFILE}, field '--profiling-path': the same profile is reached through both '{A3_DIR}' and "
             f"'{A3_PROFILE}': its launches would be counted twice",
             command=(*PARSE, A3_DIR, A3_PROFILE, "--database-path", "out/parsed"), tags=("counted-twice",)),
        Case("database: rows CSV not UTF-8", "csv",
             both(parsed_a3(), lambda root: not_utf8(KERNEL_CSV, root / KERNEL_CSV, 2, "AI_CORE")(root)),
             f"{KERNEL_CSV}, line 2, field 'Accelerator Core': not UTF-8 text: byte 0xe9 in column 2",
             command=kernel),
        Case("database: a directory over an existing database", "csv",
             both(copy_in(REPO / "tests/data/database/cpu_replayed/mm.csv", "rows/mm.csv"),
                  write("data/CPU/torch/torch2.13.0_cpu/bmm.csv", "Input Shapes\n")),
             "data/CPU/torch/torch2.13.0_cpu, field '--overwrite': already holds a database of 1 kernel type; give "
             "--overwrite to replace it (kernel types the new build lacks are removed), or another --output",
             command=("scripts/build_database.py", "directory", "--rows-dir", "rows", "--device", "CPU",
                      "--output", "data/CPU/torch/torch2.13.0_cpu")),
        Case("replay: rows CSV not UTF-8", "csv",
             both(replay_rows(), definition("defs/mm.yaml"),
                  lambda root: not_utf8("in/mm.csv", root / "in/mm.csv", 2, "dynamic")(root)),
             "in/mm.csv, line 2, field 'OP State': not UTF-8 text: byte 0xe9 in column 1", command=replay_mm),
        # --- kernel definitions as the replay job meets them ---
        Case("replay: api torch.ops.aten.no_such_op", "definitions",
             both(replay_rows(), definition("defs/mm.yaml", ("api: torch.ops.aten.mm", "api: torch.ops.aten.no_such_op"))),
             at("defs/mm.yaml", "api: torch.ops.aten.no_such_op", "field 'api': torch.ops.aten.no_such_op: torch.ops "
                "has no attribute path 'aten.no_such_op' ('_OpNamespace' 'aten' object has no attribute "
                "'no_such_op')"), command=replay_mm),
        Case("replay: hook module that does not exist", "definitions",
             both(replay_rows(), definition("defs/mm.yaml", add="hook: opperf.replay.hooks.no_such_hook\n")),
             at("defs/mm.yaml", "hook: opperf", "field 'hook': cannot import hook module "
                "'opperf.replay.hooks.no_such_hook': No module named 'opperf.replay.hooks.no_such_hook'"),
             command=replay_mm),
        Case("replay: import_modules that do not exist", "definitions",
             both(replay_rows(), definition("defs/mm.yaml", add="import_modules: [no_such_package]\n")),
             at("defs/mm.yaml", "import_modules:", "field 'import_modules': cannot import 'no_such_package': No "
                "module named 'no_such_package'"), command=replay_mm),
        Case("replay: definition YAML syntax error", "definitions",
             both(replay_rows(), definition("defs/mm.yaml", ("  - {role: tensor}\n", "  - {role: tensor\n"))),
             unclosed("defs/mm.yaml", "cache: cold", "{role: tensor"), command=replay_mm),
        # --- models / catalog / grid config as the scripts meet them ---
        Case("workload: hidden_size: '256x'", "models", edit(MOD, "hidden_size: 256\n", "hidden_size: '256x'\n"),
             at(MOD, "hidden_size: '256x'", "field 'opperf-tiny.hidden_size': must be an integer, got '256x'"),
             command=workload),
        Case("workload: num_key_value_heads: -4", "models",
             edit(MOD, "num_key_value_heads: 4\n", "num_key_value_heads: -4\n"),
             at(MOD, "num_key_value_heads: -4", "field 'opperf-tiny.num_key_value_heads': must be >= 1, got -4"),
             command=workload),
        Case("workload: unknown model", "models", nothing,
             f"{MOD}, field '--model': unknown model 'opperf-tinyy'; closest: opperf-tiny; known: {MODELS_KNOWN} "
             "(or their aliases; case and punctuation are ignored)",
             command=tuple("opperf-tinyy" if a == "opperf-tiny" else a for a in workload)),
        Case("grid: devices memory_gb: -16", "catalog", both(parsed_a3(), edit(DEV, "memory_gb: 64          #",
                                                                               "memory_gb: -16          #")),
             at("{root}/" + DEV, "memory_gb: -16", "field 'A3.memory_gb': must be > 0, got -16"), command=grid,
             note="the script's defaults are its checkout's config files, named in full", tags=("child",)),
        Case("grid: grid.yaml YAML syntax error", "grid",
             both(parsed_a3(), edit(GRID, "  small_batch: [1, 2, 4]", "  small_batch: [1, 2, 4")),
             unclosed(GRID, "  kv_cache_blocks:", "small_batch", flow="sequence", full_path=True), command=grid,
             tags=("child",)),
        Case("grid: models num_key_value_heads: -4", "models",
             both(parsed_a3(), edit(MOD, "num_key_value_heads: 4\n", "num_key_value_heads: -4\n")),
             at("{root}/" + MOD, "num_key_value_heads: -4", "field 'opperf-tiny.num_key_value_heads': must be >= 1, "
                "got -4"), command=grid, tags=("child",)),
    ]
    cases += _fault_cases(parse, kernel, replay_mm, grid, workload)
    cases += _kill_cases(parse, kernel, replay_mm)
    return cases


def _fault_cases(parse, kernel, replay_mm, grid, workload) -> list[Case]:
    comm_runs = str(REPO / "benchmarks" / "results" / "comm")
    replayed = both(replay_rows("in/replayed/mm.csv"))
    out = [
        ("parse", parse, nothing, "out/parsed"),
        ("parse (traces)", (*parse, "--trace-dir", "out/traces"), nothing,
         "out/traces/{first_trace}"),
        ("database kernel", kernel, parsed_a3(), "out/MatMulV2.csv"),
        ("database op-mapping", ("scripts/build_database.py", "op-mapping", "--kernels", KERNEL_CSV, "--device", "A3",
                                 "--definitions", "config/kernels/npu", "--output",
                                 f"out/A3/vllm_ascend/{A3_VERSION}/op_mapping.yaml"),
         parsed_a3(), f"out/A3/vllm_ascend/{A3_VERSION}/op_mapping.yaml"),
        ("database manifest", ("scripts/build_database.py", "manifest", "--files", KERNEL_CSV, "--output",
                               "out/database_manifest.tsv"), parsed_a3(), "out/database_manifest.tsv"),
        ("replay", replay_mm, both(replay_rows(), definition("defs/mm.yaml")), "out/traces/{first_trace}"),
        ("grid", grid, parsed_a3(), "out/grid/{first_csv}"),
        ("workload", workload, nothing, "out/profile"),
        ("report", ("scripts/report.py", "--csv", "in/replayed/mm.csv", "--output-dir", "out/report", "--database",
                    "CPU/torch/x"), replayed, "out/report/{first_report}"),
        ("trace_to_csv", ("scripts/trace_to_csv.py", "--trace", str(REPO / "tests/data/parse/cpu_decoder_trace.json"),
                          "--output", "out/ops.csv"), nothing, "out/ops.csv"),
        ("validate_comm_alignment", ("scripts/validate_comm_alignment.py", "--measured", f"{comm_runs}/h200x2/event",
                                     "--reference", f"{comm_runs}/h200x4/event", "--report", "out/alignment.csv"),
         nothing, "out/alignment.csv"),
        ("plot_comm_bandwidth", ("scripts/plot_comm_bandwidth.py", "--run", f"H200={comm_runs}/h200x2/event",
                                 "--output", "out/busbw.png"), nothing, "out/busbw.png"),
    ]
    # Which faults each script meets (every script shares the one error path; the parse stage gets all three).
    faults = {"parse": ("disk_full", "read_only", "no_permission"), "database kernel": ("disk_full", "read_only"),
              "replay": ("disk_full", "read_only"), "trace_to_csv": ("no_permission",),
              "validate_comm_alignment": ("read_only",)}
    # Where a fault is met before the first write: replay checks its output can be created before it replays.
    first_failure = {("replay", "read_only"): "out/mm.csv"}
    cases = []
    for name, command, prepare, target in out:
        for fault in faults.get(name, ("disk_full",)):
            cases.append(Case(f"{name}: {fault.replace('_', ' ')}", "output fault", prepare,
                              f"{first_failure.get((name, fault), target)}: cannot write: {{reason}}",
                              command=command, fault=fault, note="the first file the run writes"))
    return cases


def _kill_cases(parse, kernel, replay_mm) -> list[Case]:
    return [
        Case("parse killed mid-write, then rerun", "kill", killed_writer("out/parsed", kind="directory"), None,
             command=parse, check=rows_match_one_parse("out/parsed")),
        Case("database kernel killed mid-write, then rerun", "kill",
             both(parsed_a3(), killed_writer("out/MatMulV2.csv")), None, command=kernel, check=no_temporaries),
        Case("replay output killed mid-write, then rerun", "kill",
             both(replay_rows(), definition("defs/mm.yaml"), killed_writer("out/mm.csv")), None, command=replay_mm,
             check=no_temporaries),
        Case("trace file killed mid-write, then rerun", "kill", killed_writer("out/traces/MatMulV2/spec.txt"), None,
             command=(*parse, "--trace-dir", "out/traces"), check=no_temporaries,
             note="trace names carry a task id: the rerun writes other names into the same directory"),
        Case("a temporary from an older opperf, then rerun", "kill", legacy_temporary("out/parsed"), None,
             command=parse, check=no_temporaries),
        Case("a live writer's temporary is left alone", "kill", live_writer("out/parsed"), None, command=parse,
             check=no_temporaries_except_live),
    ]


CASES = _cases()


def expected_line(case: Case, root: Path, reason: str = "") -> str | None:
    line = case.expected(root)
    return None if line is None else line.replace("{reason}", reason)


def matches(case: Case, root: Path, got: str | None, reason: str = "") -> bool:
    """Whether an error line is the case's expected line (trace and report file names are matched as patterns)."""
    want = expected_line(case, root, reason)
    if want is None or got is None:
        return want == got
    pattern = re.escape(want).replace(re.escape("{first_trace}"), r"[^/]+/I\w+_S\d\d_\w+_\w+_\w+\.(txt|py)")
    pattern = pattern.replace(re.escape("{first_report}"), r"[\w.]+").replace(re.escape("{first_csv}"), r"[\w.]+\.csv")
    return re.fullmatch(pattern, got) is not None


# --- running a case and judging what happened ----------------------------------------------------------

SNAKEMAKE_HEADER = re.compile(r'^WorkflowError in file "[^"]+", line \d+:$')
SNAKEMAKE_FRAME = re.compile(r'^  File "[^"]+/(Snakefile|rules/[\w.]+\.smk)", line \d+, in <module>$')
FAULT_METHODS = {"disk_full": "full 64 KiB tmpfs (ENOSPC)", "read_only": "read-only bind mount (EROFS)",
                 "no_permission": "unprivileged user, directory 0555 (EACCES)"}


def snapshot(root: Path) -> set[str]:
    """Every file under the copy, but Snakemake's bookkeeping, logs and byte code."""
    return {str(path.relative_to(root)) for path in root.rglob("*")
            if path.is_file() and not ({".snakemake", "__pycache__", "logs"} & set(path.relative_to(root).parts))}


def python_env() -> dict:
    env = _env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def fault_method(fault: str | None) -> str:
    from faults import namespaces_work

    if not fault:
        return ""
    if namespaces_work():
        return FAULT_METHODS[fault]
    return "RLIMIT_FSIZE 0 (EFBIG)" if fault == "disk_full" else "chmod 0555 (EACCES)"


def command_line(case: Case) -> list[str]:
    if case.command:
        return [sys.executable, *case.command]
    return [sys.executable, "-m", "snakemake", "-n", "--cores", "1"] + (
        ["--configfile", *case.configfiles] if case.configfiles else [])


def run_case(case: Case, scratch: Path, *, in_process: bool = False) -> dict:
    """Run `case` in a fresh copy of the workflow under `scratch` and judge it (see OUTCOMES).

    As a user would (`snakemake -n`, `python scripts/...`), or `in_process` (the load-time check's own calls,
    scripts through run_cli) where the case has no fault and no kill; fault and kill cases always run as a child,
    and so do cases tagged `child` (a script whose defaults are its own checkout's config files).
    """
    from faults import expected_reason, run_with_fault
    from snakemake_api import copy_workflow

    root = copy_workflow(scratch / "wf")
    case.prepare(root)
    if case.fault:
        (root / case.fault_dir).mkdir(parents=True, exist_ok=True)
    before = snapshot(root)
    started = time.perf_counter()
    reason, inside = "", []
    if case.fault:
        run = run_with_fault(case.fault, command_line(case), root / case.fault_dir, cwd=root, env=python_env())
        returncode, output, inside = run.returncode, run.stdout + run.stderr, run.left
        reason = expected_reason(case.fault)
    elif in_process and case.expect is not None and "child" not in case.tags:
        returncode, output = _run_in_process(case, root)
    else:
        done = subprocess.run(command_line(case), cwd=root, capture_output=True, text=True, env=python_env(),
                              timeout=600)
        returncode, output = done.returncode, done.stdout + done.stderr
    wall_s = time.perf_counter() - started
    new_files = sorted(snapshot(root) - before)
    result = {"case": case.name, "group": case.group,
              "command": " ".join(case.command) if case.command else " ".join(command_line(case)[2:]),
              "fault": case.fault or "", "fault_method": fault_method(case.fault), "exit": returncode,
              "wall_s": round(wall_s, 2), "expected": expected_line(case, root, reason)}
    result.update(classify(case, root, returncode, output, new_files, inside, reason))
    return result


def _run_in_process(case: Case, root: Path) -> tuple[int, str]:
    """(exit code, output) of the case through the same calls, without a new interpreter."""
    import contextlib
    import importlib.util
    import io

    from opperf.cli import run_cli
    from opperf.errors import OpperfError

    captured = io.StringIO()
    previous = os.getcwd()
    os.chdir(root)
    try:
        if not case.command:
            try:
                _workflow_load_check(case, root)
            except OpperfError as exc:    # what rules/common.smk raises as a WorkflowError: Snakemake's framing
                return 1, f'WorkflowError in file "{root}/rules/common.smk", line 1:\n{exc}'
            return 0, ""
        script = root / case.command[0]         # the copy's: its defaults are the copy's config files
        spec = importlib.util.spec_from_file_location(f"corpus_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            code = run_cli(module.build_parser(), module.main, list(case.command[1:]))
        return code, captured.getvalue()
    finally:
        os.chdir(previous)


def _workflow_load_check(case: Case, root: Path) -> None:
    """What the Snakefile and rules/common.smk check when Snakemake loads the workflow, in the same order."""
    from snakemake.utils import update_config

    from opperf.workflow_config import check_config_file, check_workflow, config_files_by_precedence
    from opperf.yaml_files import read_yaml

    check_config_file("config/config.yaml")
    command_line_files = [str((root / f).absolute()) for f in case.configfiles]
    config = read_yaml("config/config.yaml", "workflow config")
    for extra in command_line_files:
        update_config(config, read_yaml(extra, "workflow config"))
    check_workflow(config, config_files=config_files_by_precedence(
        [*command_line_files, "config/config.yaml"], command_line_files),
        definitions_root=root / "config" / "kernels")


def classify(case: Case, root: Path, returncode: int, output: str, new_files: list[str], inside: list[str],
             reason: str) -> dict:
    lines = output.splitlines()
    framing = [i for i, line in enumerate(lines) if SNAKEMAKE_HEADER.match(line) or SNAKEMAKE_FRAME.match(line)]
    traceback_lines = [line for i, line in enumerate(lines) if i not in framing and
                       (line.startswith("Traceback (most recent call last)") or re.match(r'^\s+File "', line))]
    if case.command:
        said = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    else:
        said = [lines[i + 1] for i in framing if SNAKEMAKE_HEADER.match(lines[i]) and i + 1 < len(lines)]
    left = ([f for f in new_files if not case.fault or not f.startswith(case.fault_dir + "/")]
            + [f"{case.fault_dir}/{f}" for f in inside])
    detail = {"said": said, "framing_lines": len(framing), "left": left}
    if traceback_lines:
        return {**detail, "outcome": "traceback", "why": traceback_lines[:3]}
    if case.expect is None:                       # a kill-and-rerun case: the rerun must succeed and clean up
        if returncode != 0:
            return {**detail, "outcome": "unclear", "why": ["the rerun failed", *lines[-3:]]}
        problems = case.check(root) if case.check else []
        if any(p.startswith("rows lost") for p in problems):
            return {**detail, "outcome": "rows-lost", "why": problems}
        if any("samples, one parse gives" in p for p in problems):
            return {**detail, "outcome": "counted-twice", "why": problems}
        if problems:
            return {**detail, "outcome": "left-behind", "why": problems}
        return {**detail, "outcome": "ok", "why": []}
    if returncode == 0:
        outcome = "counted-twice" if "counted-twice" in case.tags else "accepted-wrong"
        return {**detail, "outcome": outcome, "why": ["exit 0"]}
    if case.command and returncode != 2:
        return {**detail, "outcome": "unclear", "why": [f"exit {returncode}, not 2"]}
    if not matches(case, root, said[0] if len(said) == 1 else None, reason):
        return {**detail, "outcome": "unclear", "why": [f"said {said!r}"]}
    if left:
        return {**detail, "outcome": "left-behind", "why": left}
    return {**detail, "outcome": "ok", "why": []}
