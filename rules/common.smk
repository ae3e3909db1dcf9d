"""Config validation and the input functions every rule shares (path logic only, no computation)."""

from pathlib import Path

from opperf.contract import KERNEL_TYPES_MANIFEST
from opperf.errors import OpperfError
from opperf.model_names import model_key
from opperf.versions import workload_version_dir
from opperf.workflow_config import check_workflow, config_files_by_precedence

# Config, catalog, models, definitions and sources sheet checked before any job: a mistake is one line
# naming file, line and field (raised here, at the top level, so Snakemake adds no stack frames of ours).
try:
    WORKFLOW_INPUTS = check_workflow(
        config,
        config_files=config_files_by_precedence(workflow.configfiles, workflow.config_settings.configfiles),
        overrides=workflow.config_settings.config,
        definitions_root=Path(workflow.basedir) / "config" / "kernels",
    )
except OpperfError as error:
    raise WorkflowError(str(error)) from None
DEVICES = WORKFLOW_INPUTS.devices
SOURCES = WORKFLOW_INPUTS.sources


wildcard_constraints:
    device="|".join(sorted(DEVICES)),
    stack=r"[A-Za-z0-9_]+",
    version_dir=r"[A-Za-z0-9_.+]+",
    kernel=r"[A-Za-z0-9_][A-Za-z0-9_.+\-]*",


def backend_conda_env(backend):
    """The conda env of a back end (for --sdm conda): envs/cpu.yaml, envs/cuda.yaml, envs/npu.yaml."""
    return f"../envs/{backend}.yaml"


def workload_conda_env():
    return backend_conda_env(config["workload"].get("backend", "cpu"))


def device_conda_env(wildcards):
    """The conda env of the back end that measures on `wildcards.device`."""
    return backend_conda_env(DEVICES[wildcards.device].backend)


def workload_model_dims(wildcards):
    """The workload model's own entry of models.yaml: editing another model must not re-profile."""
    import yaml

    with open(config["models"], encoding="utf-8") as handle:
        models = yaml.safe_load(handle) or {}
    return models[model_key(models, config["workload"]["model"], path=config["models"], field="workload.model")]


def workload_database():
    """(device, stack, version_dir) of the database the reference workload feeds, or None."""
    workload = config.get("workload", {})
    if not workload.get("enabled", True):
        return None
    return (workload.get("device", "CPU"), "torch", workload_version_dir(workload.get("backend", "cpu")))


def databases():
    """Every database this config builds: the registered sources' and the workload's."""
    found = {(r["device"], r["stack"], r["version_dir"]) for r in SOURCES}
    if workload_database():
        found.add(workload_database())
    return sorted(found)


def _profile_files(path):
    """A registered path as the files in it (directories expanded), so editing any one re-runs the parse."""
    path = Path(path)
    if path.is_dir():
        return sorted(str(p) for p in path.rglob("*") if p.is_file())
    return [str(path)]


def raw_profile_paths(wildcards):
    """The paths registered for one database, as the parser is given them."""
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    paths = [r["path"] for r in SOURCES if (r["device"], r["stack"], r["version_dir"]) == key]
    if workload_database() == key:
        paths.append(workload_profile_for_parser(*key))
    if not paths:
        database = "/".join(key)
        raise WorkflowError(f"no raw profile is registered for database {database} (add a row to {config['sources']})")
    return paths


def raw_profile_files(wildcards):
    """Rule inputs for the parse: every file of the registered paths, and the workload's profile directory."""
    files = []
    for path in raw_profile_paths(wildcards):
        if path.startswith("results/workload/"):
            files.append(workload_profile_dir(wildcards.device, wildcards.stack, wildcards.version_dir))
        else:
            files += _profile_files(path)
    return files


def workload_profile_dir(device, stack, version_dir):
    return f"results/workload/{device}/{stack}/{version_dir}/profile"


def workload_profile_for_parser(device, stack, version_dir):
    """cpu/cuda profiles are one Chrome trace; npu profiles are a torch_npu bundle directory."""
    root = workload_profile_dir(device, stack, version_dir)
    return root if config["workload"].get("backend", "cpu") == "npu" else f"{root}/trace.json"


def stage_code(*modules):
    """The source files of the opperf modules a rule runs, so a code change re-collects what it affects."""
    root = Path(workflow.basedir)
    files = []
    for module in modules:
        target = root / "opperf" / module
        files += (
            sorted(str(p.relative_to(root)) for p in target.rglob("*.py"))
            if target.is_dir()
            else [str((root / "opperf" / f"{module}.py").relative_to(root))]
        )
    return files + ["opperf/contract.py", "opperf/io.py"]


def kernel_types(device, stack, version_dir):
    """The kernel types of a database, from the parse checkpoint's manifest."""
    parsed = checkpoints.parse_profiles.get(device=device, stack=stack, version_dir=version_dir).output.parsed
    manifest = Path(parsed) / KERNEL_TYPES_MANIFEST
    return [line.strip() for line in manifest.read_text().splitlines() if line.strip()]


def database_files(wildcards):
    """Every per-kernel CSV and the op_mapping.yaml of one database."""
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    root = "data/{}/{}/{}".format(*key)
    return [f"{root}/{kernel}.csv" for kernel in kernel_types(*key)] + [f"{root}/op_mapping.yaml"]


def database_kernel_csvs(wildcards):
    """The per-kernel CSVs of one database (without op_mapping.yaml)."""
    return [f for f in database_files(wildcards) if f.endswith(".csv")]


def database_backend(device):
    return DEVICES[device].backend


def kernel_definitions_dir(wildcards):
    """The kernel definitions of a database's back end: config/kernels/npu or config/kernels/torch."""
    family = "npu" if database_backend(wildcards.device) == "npu" else "torch"
    return f"config/kernels/{family}"


def grid_enabled():
    return "grid" in config and config["grid"].get("enabled", True)


def replay_enabled(device):
    """Replay runs only for databases whose device back end this host can measure on."""
    return "replay" in config and database_backend(device) in config["replay"].get("backends", ["cpu"])


def _stage_root(wildcards):
    return f"results/{wildcards.device}/{wildcards.stack}/{wildcards.version_dir}"


def database_rows_input(wildcards):
    """What a database CSV is made from: the replayed CSV, else what replay would have measured."""
    if replay_enabled(wildcards.device):
        return f"{_stage_root(wildcards)}/replayed/{wildcards.kernel}.csv"
    return replay_rows_input(wildcards)


def database_rows_file(wildcards):
    """The one CSV inside database_rows_input for this kernel type."""
    if replay_enabled(wildcards.device):
        return database_rows_input(wildcards)
    return replay_rows_file(wildcards)


def database_targets():
    """The completion marker of every database this config builds (each pulls in all its files)."""
    return ["results/{}/{}/{}/database_manifest.tsv".format(*key) for key in databases()]


def all_targets(wildcards):
    targets = database_targets()
    for optional in ("report_targets", "comm_targets"):
        if optional in globals():
            targets += globals()[optional]()
    return targets


# --- grid ---


def grid_target_models(wildcards):
    """The grid's --target-models for one database, comma-separated ('' = the generic grids).

    config grid.target_models is a list for every database, or a mapping from a device key or a back end
    (tried in that order, then `default`) to a list.
    """
    targets = config["grid"]["target_models"]
    if isinstance(targets, dict):
        keys = (wildcards.device, DEVICES[wildcards.device].backend, "default")
        targets = next((targets[key] for key in keys if key in targets), [])
    return ",".join(targets)


def grid_device_backend(wildcards):
    """The back end of the database's {device} (its token cap in grid.yaml)."""
    return DEVICES[wildcards.device].backend


def grid_max_hbm_gb(wildcards):
    """The grid's HBM budget in GB: config grid.max_hbm_gb, else the catalog's memory_gb of {device}."""
    configured = config["grid"].get("max_hbm_gb")
    return configured if configured is not None else DEVICES[wildcards.device].memory_gb


def grid_max_tokens_option(wildcards):
    """`--max-tokens N` when config grid.max_tokens is set; empty to use grid.yaml's cap for the back end."""
    configured = config["grid"].get("max_tokens")
    return f"--max-tokens {configured}" if configured is not None else ""


# --- replay ---


def _definition_index(family):
    """Reported Type → definition file of a family (config/kernels/<family>), loaded once per run."""
    from opperf.replay.definitions import definition_index

    cache = _definition_index.__dict__.setdefault("cache", {})
    if family not in cache:
        backend = "npu" if family == "npu" else None
        cache[family] = {
            k: str(Path(v).relative_to(Path(workflow.basedir).resolve())) if Path(v).is_absolute() else str(v)
            for k, v in definition_index(Path(workflow.basedir) / "config" / "kernels" / family, backend).items()
        }
    return cache[family]


def kernel_definition(wildcards):
    """The one definition file replaying {kernel} on the database's back end ([] when none exists)."""
    family = Path(kernel_definitions_dir(wildcards)).name
    path = _definition_index(family).get(wildcards.kernel)
    return [path] if path else []


def kernel_definition_option(wildcards):
    """The file kernel_definition gives, as scripts/replay.py's --definition value ('' = none: no_definition)."""
    found = kernel_definition(wildcards)
    return found[0] if found else "''"


def replay_rows_input(wildcards):
    """The rows a replay job measures: the grid stage's directory, else the parse checkpoint's."""
    if grid_enabled():
        return f"{_stage_root(wildcards)}/grid"
    checkpoints.parse_profiles.get(**wildcards)
    return f"{_stage_root(wildcards)}/parsed"


def replay_rows_file(wildcards):
    """The one CSV inside replay_rows_input for this kernel type."""
    return f"{replay_rows_input(wildcards)}/{wildcards.kernel}.csv"


def report_backend(wildcards):
    """The back end a database's replay ran on (its device's, from the catalog)."""
    return database_backend(wildcards.device)


def replay_device_slots(kind):
    """resources: gpu=1 for cuda databases, npu=1 for npu databases, 0 otherwise (cpu)."""

    def slots(wildcards):
        return 1 if database_backend(wildcards.device) == {"gpu": "cuda", "npu": "npu"}[kind] else 0

    return slots


def replay_device_ids_option(wildcards):
    ids = config["replay"].get("device_ids")
    return f"--device-ids {','.join(str(i) for i in ids)}" if ids else ""


def report_targets():
    """The report of every database that this host replays."""
    targets = []
    for device, stack, version_dir in databases():
        if replay_enabled(device):
            root = f"reports/{device}/{stack}/{version_dir}"
            targets += [f"{root}/replay_report.md", f"{root}/summary.json", f"{root}/duration_gap.csv"]
    return targets


def report_replayed_csvs(wildcards):
    """Every replayed CSV of one database (the kernel list comes from the parse checkpoint)."""
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    return ["results/{}/{}/{}/replayed/{}.csv".format(*key, kernel) for kernel in kernel_types(*key)]


def replay_prune_options(wildcards):
    """--prune-invalid-rows / --prune-empty-duration-rows as config replay.* asks (off by default)."""
    options = []
    if config["replay"].get("prune_invalid_rows"):
        options.append("--prune-invalid-rows")
    if config["replay"].get("prune_empty_duration_rows"):
        options.append("--prune-empty-duration-rows")
    return " ".join(options)


# --- comm ---


def comm_targets():
    """The collective CSVs of config `comm` (none when comm.enabled is false): data/{device}/{backend}/{version}/…"""
    from opperf.comm.collectives import collective_file_name, comm_version_dir

    comm = config["comm"]
    if not comm["enabled"]:
        return []
    backend = comm["backend"]
    version_dir = comm["version_dir"] or comm_version_dir(backend)
    return [f"data/{comm['device']}/{backend}/{version_dir}/{collective_file_name(backend, op)}" for op in comm["ops"]]


def comm_op(wildcards):
    """The collective a CSV target holds, from its file name (all_reduce.csv, hcom_allReduce_.csv, …)."""
    from opperf.comm.collectives import op_of_file_name

    return op_of_file_name(wildcards.comm, wildcards.collective)


def comm_tier_option():
    tiers = config["comm"]["topology_tiers"]
    return f"--topology-tier {' '.join(str(t) for t in tiers)}" if tiers else ""


def comm_device_slots(backend):
    """resources: the benchmark's processes each hold one device of its back end (gpu for nccl, npu for hccl)."""

    def slots(wildcards):
        return config["comm"]["nproc"] if wildcards.comm == backend else 0

    return slots


def comm_conda_env():
    from opperf.comm.collectives import RUNTIME_OF_BACKEND

    return backend_conda_env(RUNTIME_OF_BACKEND[config["comm"]["backend"]])
