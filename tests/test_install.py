"""What a new user runs first: README's commands (CI runs the test command verbatim), its per-host configs
planned on this CPU-only host (no CUDA torch, no CANN), and the executor plugin of every profile installable."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from opperf.versions import installed_torch_cuda_version
from snakemake_api import copy_workflow, planned_rules, run_workflow

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def readme_commands() -> list[str]:
    """The command lines of README's first code block (build, then test)."""
    block = re.search(r"```bash\n(.*?)```", README, flags=re.DOTALL).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def readme_config(name: str) -> dict:
    """The YAML block of README that starts with `# <name>`."""
    block = re.search(rf"```yaml\n(# {re.escape(name)}:.*?)```", README, flags=re.DOTALL).group(1)
    return yaml.safe_load(block)


def test_ci_runs_exactly_readmes_test_command():
    build, test = readme_commands()
    ci_lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci_lines[-1] == test
    assert test.endswith("&& python -m pytest -q") and build.endswith("&& snakemake --cores 2")
    assert build.rsplit("&&", 1)[0] == test.rsplit("&&", 1)[0], "both commands install the same way"
    assert "pip install torch==2.13.0 -e '.[test]'" in test


def test_every_profiles_executor_is_installed_by_an_extra_the_docs_name():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    docs = README + (REPO / "docs" / "cluster.md").read_text()
    for profile in sorted((REPO / "profiles").iterdir()):
        executor = yaml.safe_load((profile / "config.v8+.yaml").read_text()).get("executor")
        if executor is None:
            continue
        plugin = f"snakemake-executor-plugin-{executor}"
        extra = next((name for name, packages in extras.items() if any(p.startswith(plugin) for p in packages)),
                     None)
        assert extra, f"{profile.name} needs {plugin}, which no extra of pyproject.toml installs"
        assert f"pip install -e '.[{extra}]'" in docs, f"README/docs/cluster.md never say to install .[{extra}]"


def test_transformers_is_held_to_one_tested_range_that_holds_the_h200_image_and_what_msmodeling_imports():
    """pyproject's `test` and `transformers` extras, every env file and README name one range; it holds 5.17 (the
    H200 image) and the release this suite runs, and stops below 5.24 (msmodeling's models import
    `transformers.modeling_attn_mask_utils`, which 5.24 removed; 5.40 drops the `past_key_values` argument)."""
    import importlib.metadata

    from packaging.specifiers import SpecifierSet

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {name: next(p for p in packages if p.startswith("transformers")) for name, packages in extras.items()
            if any(p.startswith("transformers") for p in packages)}
    assert set(pins) == {"test", "transformers", "msmodeling"} and len(set(pins.values())) == 1
    pin = pins["transformers"]
    for env in ("cpu", "cuda", "npu"):
        assert f"- {pin}  " in (REPO / "envs" / f"{env}.yaml").read_text(), env
    assert f"`{pin.removeprefix('transformers')}`" in README
    allowed = SpecifierSet(pin.removeprefix("transformers"))
    assert "5.17.0" in allowed and "5.23.0" in allowed and "5.24.0" not in allowed and "4.56.2" not in allowed
    assert importlib.metadata.version("transformers") in allowed


@pytest.mark.workflow
@pytest.mark.parametrize("name, device_jobs", [
    ("my_h100_host.yaml", {"profile_workload", "comm_collective"}),
    ("my_ascend_host.yaml", {"parse_profiles", "comm_collective"}),
])
def test_readmes_device_host_configs_plan_on_a_host_without_the_device_toolchain(tmp_path, monkeypatch, name,
                                                                                 device_jobs):
    for variable in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        monkeypatch.delenv(variable, raising=False)
    workdir = copy_workflow(tmp_path / "wf")
    plan = run_workflow(workdir, dry_run=True, config=readme_config(name))
    assert device_jobs <= set(planned_rules(plan))
    if name == "my_h100_host.yaml":
        assert ("profile_workload", {"device": "H100", "stack": "torch", "version_dir": "torch2.11.0_cuda13.0"}) in plan
    collectives = {w["comm_version"] for rule, w in plan if rule == "comm_collective"}
    assert collectives == {readme_config(name)["comm"]["version_dir"]}


@pytest.mark.workflow
@pytest.mark.skipif(installed_torch_cuda_version() != "", reason="this torch is a CUDA build: it knows its version")
def test_without_version_dir_planning_says_which_key_to_set(tmp_path):
    config = readme_config("my_h100_host.yaml")
    del config["workload"]["version_dir"]
    with pytest.raises(Exception, match=r"workload\.version_dir: workload back end 'cuda' asked for, but the "
                                        r"installed torch is a CPU build; .* set workload\.version_dir"):
        run_workflow(copy_workflow(tmp_path / "wf"), dry_run=True, config=config)
