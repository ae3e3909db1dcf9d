"""envs/*.yaml hold what the rules that use them import: a `--sdm conda` run must not die of a missing module
(polars at parse), nor carry packages no stage needs.

Static and cheap: each rule's conda file and scripts are read from rules/*.smk; each script's imports are
followed through the opperf modules it reaches (and the replay hooks its kernel definitions name); every
third-party module left must be a package of each env file the rule can run in.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("cpu", "cuda", "npu")
# conda: directives that pick the env by back end (rules/common.smk): the rule may run in any of the three.
PER_BACKEND_ENV = {"device_conda_env", "workload_conda_env()", "comm_conda_env()"}
# ... and one that only the back ends with torch.profiler traces use (stage 4b: rules/common.smk phase_conda_env).
TRACE_BACKEND_ENV = {"phase_conda_env"}
# Modules a rule imports only on a back end whose env is not this one, or that the host provides.
NOT_FROM_THE_ENV = {
    # torch_npu / vllm_ascend code runs on the npu back end only; check_npu_definitions.py (cpu env) imports
    # the torch_npu wheel it downloads itself.
    # pynvml (nvidia-ml-py) is read on the cuda back end only (the GPU's power state), by an optional import.
    "cpu": {"torch_npu", "vllm_ascend", "pynvml"},
    "cuda": {"torch_npu", "vllm_ascend"},
    # vLLM-Ascend is the serving stack the profile came from; envs/npu.yaml says to install it by its guide.
    "npu": {"vllm_ascend", "pynvml"},
}
# msmodeling's own modules: opperf/consumer's standalone scripts import them from its checkout, run by the Python
# that imports it ($OPPERF_MSMODELING_PYTHON; docs/msmodeling.md), not installed from any env file.
MSMODELING_CHECKOUT = {"cli", "tensor_cast"}
for _modules in NOT_FROM_THE_ENV.values():
    _modules |= MSMODELING_CHECKOUT
ENV_TOOLS = {"python", "pip"}      # what every env needs to run `python scripts/…` and pip itself


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_name(requirement: str) -> str:
    return normalise(re.split(r"[=<>!~\[ ;]", requirement.strip(), maxsplit=1)[0])


def env_packages(backend: str) -> set[str]:
    """The package names an env file installs (conda and pip), without versions or pip options."""
    document = yaml.safe_load((REPO / "envs" / f"{backend}.yaml").read_text())
    names = set()
    for entry in document["dependencies"]:
        items = entry["pip"] if isinstance(entry, dict) else [entry]
        names |= {package_name(item) for item in items if not item.startswith("-")}
    return names


def rule_blocks() -> dict[str, str]:
    """rule/checkpoint name → its text, for every rule in rules/*.smk."""
    blocks = {}
    for path in sorted((REPO / "rules").glob("*.smk")):
        parts = re.split(r"^(?:rule|checkpoint) (\w+):\n", path.read_text(), flags=re.MULTILINE)
        for name, body in zip(parts[1::2], parts[2::2]):
            blocks[name] = re.split(r"^\S", body, maxsplit=1, flags=re.MULTILINE)[0]
    return blocks


def rule_envs(body: str) -> set[str]:
    match = re.search(r"^    conda:\n        (.+)$", body, flags=re.MULTILINE)
    assert match, "a rule without conda: cannot run under --sdm conda"
    value = match.group(1).strip()
    if literal := re.fullmatch(r'"\.\./envs/(\w+)\.yaml"', value):
        return {literal.group(1)}
    if value in TRACE_BACKEND_ENV:
        return {"cpu", "cuda"}
    assert value in PER_BACKEND_ENV, f"conda: {value} is new to this test; say which envs it can give"
    return set(BACKENDS)


@cache
def module_file(module: str) -> Path | None:
    """The source file of an opperf module (package or module), None for anything else."""
    if module != "opperf" and not module.startswith("opperf."):
        return None
    base = REPO / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def hook_modules() -> frozenset[str]:
    """The hook modules kernel definitions name (imported by name at replay: opperf.replay.inputs)."""
    hooks = set()
    for path in (REPO / "config" / "kernels").rglob("*.yaml"):
        document = yaml.safe_load(path.read_text()) or {}
        if document.get("hook"):
            hooks.add(document["hook"])
    return frozenset(hooks)


@cache
def third_party_imports(script: str) -> frozenset[str]:
    """Top-level third-party modules a script imports, followed through every opperf module it reaches."""
    found, seen = set(), set()
    pending = [REPO / script]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        package = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if path.name == "__init__.py":
            package += ".__init__"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:          # relative: resolve against this module's package
                    base = package.split(".")[: -node.level]
                    names = [".".join(base + ([node.module] if node.module else []))]
                else:
                    names = [node.module]
                names += [f"{names[0]}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "opperf":
                    for prefix in (name.split(".")[:i] for i in range(1, len(name.split(".")) + 1)):
                        if (file := module_file(".".join(prefix))) is not None:
                            pending.append(file)
                    if name == "opperf.replay.inputs":
                        pending += [f for hook in hook_modules() if (f := module_file(hook)) is not None]
                elif top not in sys.stdlib_module_names and top != "__future__":
                    found.add(top)
    return frozenset(found)


@cache
def installed_providers() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


# Modules whose package is installed only where they run (GPU hosts), so the metadata here cannot name it.
NOT_INSTALLED_HERE = {"pynvml": "nvidia-ml-py"}


def distribution(module: str) -> str:
    """The package that provides a top-level module (yaml → pyyaml), from the installed metadata."""
    providers = installed_providers().get(module)
    if providers:
        return normalise(providers[0])
    return normalise(NOT_INSTALLED_HERE.get(module, module))


@cache
def required_packages() -> dict[str, dict[str, set[str]]]:
    """env → package → the rules that need it."""
    required: dict[str, dict[str, set[str]]] = {backend: {} for backend in BACKENDS}
    for rule, body in rule_blocks().items():
        scripts = set(re.findall(r"scripts/\w+\.py", body))
        assert scripts, f"rule {rule} runs no script of ours; teach this test what it imports"
        for backend in rule_envs(body):
            for script in scripts:
                for module in third_party_imports(script) - NOT_FROM_THE_ENV[backend]:
                    required[backend].setdefault(distribution(module), set()).add(rule)
    return required


def test_the_import_walk_finds_what_the_stages_import():
    # parse reads with polars; the report plots with matplotlib; replay's hooks reach torch_npu.
    assert "polars" in third_party_imports("scripts/parse_kernel_details.py")
    assert "matplotlib" in third_party_imports("scripts/report.py")
    assert {"torch", "torch_npu", "vllm_ascend", "jinja2"} <= third_party_imports("scripts/replay.py")
    assert distribution("yaml") == "pyyaml"


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_env_holds_what_its_rules_import_and_nothing_else(backend):
    needed = required_packages()[backend]
    installed = env_packages(backend)
    missing = {package: sorted(rules) for package, rules in needed.items() if package not in installed}
    assert not missing, f"envs/{backend}.yaml lacks packages its rules import: {missing}"
    unused = installed - set(needed) - ENV_TOOLS
    assert not unused, f"envs/{backend}.yaml installs packages no rule using it imports: {sorted(unused)}"


def test_cuda_env_names_a_pytorch_index():
    pip = next(entry["pip"] for entry in yaml.safe_load((REPO / "envs" / "cuda.yaml").read_text())["dependencies"]
               if isinstance(entry, dict))
    assert any(re.fullmatch(r"--(extra-)?index-url https://download\.pytorch\.org/whl/cu\d+", item) for item in pip)
