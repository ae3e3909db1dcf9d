"""Config validation and the input functions every rule shares (path logic only, no computation)."""

import difflib
import shlex
from pathlib import Path

from opperf.contract import CONSUMER_QUERIES_RECORD, KERNEL_TYPES_MANIFEST
from opperf.errors import OpperfError
from opperf.model_names import model_reference, read_models
from opperf.versions import workload_database_version_dir, workload_version_dir
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


def phase_conda_env(wildcards):
    """Stage 4b's env: the device's, on the cpu and cuda back ends only (it follows a torch.profiler trace)."""
    return device_conda_env(wildcards)


def workload_model_dims(wildcards):
    """The workload model's own entry of models.yaml, or its config.json's content: editing another model must not
    re-profile, editing this one must."""
    models = read_models(config["models"])
    model = model_reference(config["workload"]["model"], models, path=config["models"], field="workload.model")
    if model.is_config:
        from opperf.workload.transformers_model import read_config

        return read_config(model.config_path, num_layers=config["workload"]["num_layers"])
    return models[model.name]


def workload_model_option(wildcards):
    """profile_workload.py's model: --transformers-config for a config.json, else --models/--model; its depth,
    decode batches, KV cache, experts and routing where the config sets them."""
    workload = config["workload"]
    name = workload["model"]
    if model_reference(name, config["models"], field="workload.model").is_config:
        option = f"--transformers-config {shlex.quote(name)}"
    else:
        option = f"--models {shlex.quote(config['models'])} --model {shlex.quote(name)}"
    if workload["num_layers"]:
        option += f" --num-layers {workload['num_layers']}"
    if workload["decode_batch_sizes"]:
        option += " --decode-batch-sizes " + " ".join(map(str, workload["decode_batch_sizes"]))
    # How a config.json model runs (profile_workload.py refuses them for the reference decoder, naming the option).
    if workload["kv_cache"] != "dynamic":
        option += f" --kv-cache {workload['kv_cache']}"
    if workload["experts_implementation"]:
        option += f" --experts-implementation {workload['experts_implementation']}"
    if workload["routing"] != "model":
        option += f" --routing {workload['routing']}"
    return option


def version_dir_from_config_or_host(key, version_dir_for):
    """The version_dir of config section `key` (workload, comm): version_dir_for(config `<key>.version_dir`)
    checks a configured one, or reads it from this host's toolchain when none is configured.

    A submit host (a SLURM login node) has no GPU or CANN to read a device's versions from: planning there
    takes them from the config instead (docs/cluster.md), and the device's job refuses a stack that differs.
    """
    configured = config[key].get("version_dir")
    try:
        return version_dir_for(configured)
    except OpperfError as exc:
        if configured:
            raise WorkflowError(f"config {key}.version_dir: {exc}") from None
        raise WorkflowError(
            f"{key}.version_dir: {exc}; this host cannot read the device's versions, so set {key}.version_dir "
            f"in your config to the device host's (docs/cluster.md, 'What the submit host needs')"
        ) from None


def workload_database():
    """(device, stack, version_dir) of the database the reference workload feeds, or None. Its version_dir is the
    stack's (config workload.version_dir, else this host's), and the model's name for a model other than the
    demo's (workload_database_version_dir): a user's model gets its own database, beside the demo's."""
    workload = config.get("workload", {})
    if not workload.get("enabled", True):
        return None
    backend = workload.get("backend", "cpu")
    stack = version_dir_from_config_or_host("workload", lambda given: workload_version_dir(backend, given))
    return (workload.get("device", "CPU"), "torch", workload_model_version_dir(stack))


def workload_model_version_dir(stack_version_dir):
    """workload_database_version_dir of the configured model (worked out once per run)."""
    cache = workload_model_version_dir.__dict__.setdefault("cache", {})
    if stack_version_dir not in cache:
        model = config["workload"]["model"]
        cache[stack_version_dir] = workload_database_version_dir(stack_version_dir, model, config["models"])
    return cache[stack_version_dir]


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
        raise unknown_database_error(key)
    return paths


def unknown_database_error(key):
    """The error of a target whose database this config does not build: the closest databases it does (a
    typo'd version_dir, torch2.13_cpu for torch2.13.0_cpu, is the usual cause) and how to add a new one."""
    database = "/".join(key)
    known = {"/".join(k): k for k in databases()}
    same_stack = {k[2]: name for name, k in known.items() if k[:2] == tuple(key[:2])}
    if same_stack:  # named by version_dir alone, as the typo is
        closest = [(v, same_stack[v]) for v in difflib.get_close_matches(key[2], same_stack, n=3, cutoff=0.5)]
    else:
        closest = [(name, name) for name in difflib.get_close_matches(database, known, n=3, cutoff=0.5)]
    named = [
        f"{shown} (the workload's)" if known[name] == workload_database() else f"{shown} (from {config['sources']})"
        for shown, name in closest
    ]
    hint = f"closest: {', '.join(named)}; " if named else ""
    return WorkflowError(
        f"{database} is not a database of this config ({hint}all {len(known)}: {', '.join(known)}); "
        f"a new database needs its raw profile registered: add a row to {config['sources']}"
    )


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


# The consumer modules the database stage's scripts run besides opperf/database/: the model of the runtime that
# lays and checks a database, the consumer's queries, scenarios and answer status, predictions.
DATABASE_CONSUMER_MODULES = (
    "consumer/dtype",
    "consumer/interpolation",
    "consumer/model_queries",
    "consumer/msmodeling_oracle",
    "consumer/msmodeling_runtime",
    "consumer/predict",
    "consumer/queries",
    "consumer/runtime",
    "consumer/scenarios",
    "consumer/status",
)


def database_code(*modules):
    """stage_code of the database stage: opperf/database/, the consumer modules it runs, and `modules`."""
    return stage_code("database", *DATABASE_CONSUMER_MODULES, *modules)


def kernel_types(device, stack, version_dir):
    """The kernel types of a database: the parse checkpoint's manifest, or, when the grid adds the types of the
    consumer's queries (grid.consumer_queries), the grid checkpoint's. Only then does planning wait for the grid,
    so a dry run of the default configuration shows every job."""
    key = dict(device=device, stack=stack, version_dir=version_dir)
    if consumer_queries_apply(device):
        rows = checkpoints.generate_shape_grid.get(**key).output.grid
    else:
        rows = checkpoints.parse_profiles.get(**key).output.parsed
    manifest = Path(rows) / KERNEL_TYPES_MANIFEST
    return [line.strip() for line in manifest.read_text().splitlines() if line.strip()]


def checked_kernel_type(wildcards):
    """{kernel} of a per-kernel target, once the parse checkpoint says it is a kernel type of its database.

    A typo'd target (MatMulV9.csv) would otherwise be planned and fail later with a missing file; this stops
    with one line naming the target, the closest kernel types and how many there are.
    """
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    known = kernel_types(*key)
    if wildcards.kernel not in known:
        database = "/".join(key)
        closest = difflib.get_close_matches(wildcards.kernel, known, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(closest)}; " if closest else ""
        raise WorkflowError(
            f"data/{database}/{wildcards.kernel}.csv: {wildcards.kernel!r} is not a kernel type of database "
            f"{database} ({hint}all {len(known)}: {', '.join(known)})"
        )
    return wildcards.kernel


def database_kernel_csvs(wildcards):
    """The runtime's per-kernel CSVs of one database: data/{device}/{stack}/{version_dir}/{KernelType}.csv."""
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    root = "data/{}/{}/{}".format(*key)
    return [f"{root}/{kernel}.csv" for kernel in kernel_types(*key)]


def database_files(wildcards):
    """Every file of one database: the runtime's kernel CSVs, their layouts files, op_mapping.yaml and, for a cpu
    or cuda device, msmodeling_device.py (the DeviceProfile msmodeling's CLI loads)."""
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    root = "data/{}/{}/{}".format(*key)
    layouts = [f"{root}/layouts/{kernel}.csv" for kernel in kernel_types(*key)]
    profile = [f"{root}/msmodeling_device.py"] if database_backend(wildcards.device) in ("cpu", "cuda") else []
    return database_kernel_csvs(wildcards) + layouts + [f"{root}/op_mapping.yaml"] + profile


def database_consumer_queries_grid(wildcards):
    """The grid's output directory where the grid records the consumer's queries (its consumer_queries.json says
    who recorded them, and op_mapping.yaml keeps it), else nothing."""
    if not consumer_option(wildcards):
        return []
    key = dict(device=wildcards.device, stack=wildcards.stack, version_dir=wildcards.version_dir)
    return checkpoints.generate_shape_grid.get(**key).output.grid


def database_consumer_queries_option(wildcards):
    grid = database_consumer_queries_grid(wildcards)
    return f"--consumer-queries {grid}/{CONSUMER_QUERIES_RECORD}" if grid else ""


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
    checked_kernel_type(wildcards)
    if replay_enabled(wildcards.device):
        return f"{_stage_root(wildcards)}/replayed/{wildcards.kernel}.csv"
    return replay_rows_input(wildcards)


def phase_replay_enabled(device):
    """Phase replay follows a torch.profiler trace's call order: the cpu and cuda databases replayed here whose back
    end replay.phase.backends names."""
    return (
        replay_enabled(device)
        and config["replay"]["phase"]["enabled"]
        and database_backend(device) in config["replay"]["phase"]["backends"]
    )


def phase_table_path(wildcards):
    return f"{_stage_root(wildcards)}/phase_replay.csv"


def database_phase_input(wildcards):
    """The phase stage's table a database CSV folds in, where the stage runs (else nothing)."""
    return [phase_table_path(wildcards)] if phase_replay_enabled(wildcards.device) else []


def database_phase_option(wildcards):
    table = database_phase_input(wildcards)
    return f"--phase {table[0]}" if table else ""


def phase_replay_device(wildcards):
    """The torch device the phases run on: the database's back end, the first of replay.device_ids on cuda."""
    if database_backend(wildcards.device) != "cuda":
        return "cpu"
    ids = config["replay"].get("device_ids")
    return f"cuda:{ids[0]}" if ids else "cuda"


def phase_replay_options(wildcards):
    """scripts/phase_replay.py's options from config replay.phase."""
    phase = config["replay"]["phase"]
    return f"--{'' if phase['cold_copies'] else 'no-'}cold-copies --iterations {phase['iterations']}"


def database_rows_file(wildcards):
    """The one CSV inside database_rows_input for this kernel type."""
    if replay_enabled(wildcards.device):
        return database_rows_input(wildcards)
    return replay_rows_file(wildcards)


def database_targets():
    """Every database this config builds: its completion marker (which pulls in all its files) and its check."""
    return [
        path.format(*key)
        for key in databases()
        for path in ("results/{}/{}/{}/database_manifest.tsv", "reports/{}/{}/{}/database_check.json")
    ]


def not_a_device_pattern():
    """Wildcard pattern of a path segment that is no device key (nor results/workload, reports/npu_check)."""
    known = "|".join(sorted([*DEVICES, "workload", "npu_check"]))
    # The segment is always followed by "/{stack}/": the lookahead must end there, not at the path's end.
    return rf"(?!(?:{known})/)[^/]+"


def unknown_device_error(wildcards):
    """Input function of the unknown_device rule. It always stops, with one line naming the valid devices."""
    from opperf.devices import resolve_device

    target = f"{wildcards.folder}/{wildcards.device}/{wildcards.stack}/{wildcards.rest}"
    try:
        hint = f"; it is the full name of {resolve_device(wildcards.device, DEVICES).name!r}: paths use the key"
    except OpperfError:
        hint = f"; add it to {config['devices']} to build a database for it"
    raise WorkflowError(
        f"{target}: {wildcards.device!r} is not a device key of {config['devices']} "
        f"(keys: {', '.join(sorted(DEVICES))}){hint}"
    )


def all_targets(wildcards):
    targets = database_targets()
    for optional in ("report_targets", "comm_targets"):
        if optional in globals():
            targets += globals()[optional]()
    return targets


# --- grid ---


def consumer_queries_apply(device):
    """Whether the grid adds the consumer's query rows to a database of {device}: grid.consumer_queries is on
    and its back end is a torch one (an NPU performance model queries TensorCast's own ops, not these)."""
    return (
        grid_enabled() and bool(config["grid"].get("consumer_queries")) and database_backend(device) in ("cpu", "cuda")
    )


def consumer_option(wildcards):
    """--consumer-models (the target models), their dtype, scenario space and recorder where config
    grid.consumer_queries asks: the grid's rows and the check's end-to-end gate are of the same queries."""
    if not consumer_queries_apply(wildcards.device) or not grid_target_models(wildcards):
        return ""
    grid = config["grid"]
    return (
        f"--consumer-models {shlex.quote(grid_target_models(wildcards))} --consumer-dtype {grid['consumer_dtype']} "
        f"--scenarios {shlex.quote(grid['scenarios'])} --scenario-space {shlex.quote(grid['scenario_space'])} "
        f"{consumer_recorder_option(wildcards)}"
    )


def consumer_recorder(wildcards):
    """Who records the target models' queries for this database (opperf.consumer.recorder.choose_recorder of
    config grid.consumer_recorder, worked out once per run: auto probes msmodeling's Python), or None where the
    grid records none. An explicit `msmodeling` that cannot run stops the plan in one line."""
    if not consumer_queries_apply(wildcards.device) or not grid_target_models(wildcards):
        return None
    from opperf.consumer.recorder import choose_recorder

    grid = config["grid"]
    models = tuple(per_device(grid["target_models"], wildcards.device))
    cache = consumer_recorder.__dict__.setdefault("cache", {})
    if models not in cache:
        try:
            cache[models] = choose_recorder(grid["consumer_recorder"], models, config["models"], grid["consumer_dtype"])
        except OpperfError as error:
            raise WorkflowError(str(error)) from None
    return cache[models]


def consumer_recorder_option(wildcards):
    """--consumer-recorder as chosen for this run (msmodeling or transformers, never auto: the grid and the check
    record with the same program), and the msmodeling checkout it chose with the device catalog."""
    choice = consumer_recorder(wildcards)
    if choice is None:
        return ""
    option = f"--consumer-recorder {choice.recorder}"
    if choice.install is not None:
        # msmodeling records on the database's device, as the catalog describes it (its DeviceProfile).
        option += f" --msmodeling {shlex.quote(str(choice.install.directory))} --devices {config['devices']}"
    return option


def grid_msmodeling_commit(wildcards):
    """The msmodeling commit that records the queries (a param: another commit re-runs the grid), else ''."""
    choice = consumer_recorder(wildcards)
    return choice.install.commit or "unknown" if choice is not None and choice.install is not None else ""


def grid_recorder_code(wildcards):
    """opperf's code that runs msmodeling's recorder, where it records this database's queries."""
    choice = consumer_recorder(wildcards)
    return stage_code("consumer") if choice is not None and choice.install is not None else []


def grid_consumer_option(wildcards):
    """The grid's consumer options, and --queries-only where config grid.queries_only asks."""
    option = consumer_option(wildcards)
    return option + (" --queries-only" if option and config["grid"]["queries_only"] else "")


def grid_model_configs(wildcards):
    """The transformers config.json files among the grid's target models and, where the grid records their queries,
    the scenario spaces: editing one re-runs the grid."""
    models = read_models(config["models"])
    references = [model_reference(m, models) for m in per_device(config["grid"]["target_models"], wildcards.device)]
    configs = [str(reference.config_path) for reference in references if reference.is_config]
    return configs + ([config["grid"]["scenarios"]] if consumer_queries_apply(wildcards.device) else [])


def database_check_options(wildcards):
    """The check's density gate (the grid's target models) and, with grid.consumer_queries, its end-to-end
    gate; the grid's own models file and patterns. Nothing of the kind without the grid stage."""
    if not grid_enabled():
        return ""
    models = grid_target_models(wildcards)
    options = (
        f"--models {config['models']} --grid-config {config['grid']['patterns']} --target-models {shlex.quote(models)}"
    )
    if config["grid"].get("max_tokens"):
        options += f" --max-tokens {config['grid']['max_tokens']}"
    return f"{options} {consumer_option(wildcards)}".rstrip()


def per_device(setting, device):
    """A config list for a database of {device}: the list itself, or from a mapping of device keys and back ends
    to lists the first of {device}, its back end, `default` (else [])."""
    if isinstance(setting, dict):
        keys = (device, DEVICES[device].backend, "default")
        return next((setting[key] for key in keys if key in setting), [])
    return setting


def grid_target_models(wildcards):
    """The grid's --target-models for one database, comma-separated ('' = the generic grids): config
    grid.target_models, a list or a mapping by device key or back end (per_device)."""
    return ",".join(per_device(config["grid"]["target_models"], wildcards.device))


def grid_density_standard(wildcards):
    """The density standard grid.yaml names (its `standard:` key, relative to it; else the shipped one)."""
    import yaml

    patterns = Path(config["grid"]["patterns"])
    named = (yaml.safe_load(patterns.read_text(encoding="utf-8")) or {}).get("standard")
    return str(patterns.parent / named) if named else "config/density_standard.yaml"


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


def _definition_index(backend):
    """Reported Type → definition file of the types `backend` replays (exactly one each), loaded once per run."""
    from opperf.replay.definitions import definition_index

    cache = _definition_index.__dict__.setdefault("cache", {})
    if backend not in cache:
        family = "npu" if backend == "npu" else "torch"
        cache[backend] = {
            k: str(Path(v).relative_to(Path(workflow.basedir).resolve())) if Path(v).is_absolute() else str(v)
            for k, v in definition_index(Path(workflow.basedir) / "config" / "kernels" / family, backend).items()
        }
    return cache[backend]


def kernel_definition(wildcards):
    """The one definition file replaying {kernel} on the database's back end ([] when none exists)."""
    path = _definition_index(database_backend(wildcards.device)).get(wildcards.kernel)
    return [path] if path else []


def database_kernel_definitions(wildcards):
    """The definition files op_mapping.yaml is generated from: one per kernel type of the database that has one.

    Not the whole definitions directory: editing (or restoring) another kernel type's file must not rewrite
    this database's op_mapping.yaml.
    """
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    index = _definition_index(database_backend(wildcards.device))
    return sorted({index[kernel] for kernel in kernel_types(*key) if kernel in index})


def kernel_definition_option(wildcards):
    """The file kernel_definition gives, as scripts/replay.py's --definition value ('' = none: no_definition)."""
    found = kernel_definition(wildcards)
    return found[0] if found else "''"


def replay_rows_input(wildcards):
    """The rows a replay job measures: the grid stage's directory, else the parse checkpoint's."""
    checked_kernel_type(wildcards)
    return f"{_stage_root(wildcards)}/{'grid' if grid_enabled() else 'parsed'}"


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
        if predict_enabled(device):
            targets.append(f"reports/{device}/{stack}/{version_dir}/predictions.json")
    return targets


def predict_enabled(device):
    """Stage 7b runs for a replayed cpu/cuda database whose grid names target models and scenarios to predict."""
    return (
        config["predict"]["enabled"]
        and replay_enabled(device)
        and database_backend(device) in ("cpu", "cuda")
        and bool(per_device(config["grid"]["target_models"], device))
        and bool(per_device(config["predict"]["scenarios"], device))
    )


def predict_options(wildcards):
    """scripts/predict.py's models, scenarios, TP and dtype for one database (config predict, grid.target_models)."""
    dtype = config["predict"]["dtype"]
    if dtype is None:
        # The model's dtype where the workflow knows it (its workload, its recorded queries); else the database's
        # own, which predict.py reads from op_mapping.yaml.
        workload = config["workload"]
        on_workload = workload["enabled"] and DEVICES[wildcards.device].backend == workload["backend"]
        if on_workload:
            dtype = workload["dtype"]
        elif config["grid"]["consumer_queries"]:
            dtype = config["grid"]["consumer_dtype"]
    models = " ".join(
        f"--model {shlex.quote(m)}" for m in per_device(config["grid"]["target_models"], wildcards.device)
    )
    scenarios = " ".join(f"--scenario {s}" for s in per_device(config["predict"]["scenarios"], wildcards.device))
    runner = f" --runner {config['predict']['runner']}{predict_msmodeling_option()}"
    return f"{models} {scenarios} --tp {config['predict']['tp']}{runner}" + (f" --dtype {dtype}" if dtype else "")


def predict_msmodeling_option():
    """--msmodeling DIR where a checkout is found when the workflow plans (as the grid's recorder finds it), so
    predict.py, which may then give way to msmodeling's own runner, uses the same one; none for runner opperf."""
    if config["predict"]["runner"] == "opperf":
        return ""
    from opperf.consumer.msmodeling_env import find_msmodeling

    try:
        install = find_msmodeling()
    except OpperfError as error:
        raise WorkflowError(str(error)) from None
    return f" --msmodeling {shlex.quote(str(install.directory))}" if install is not None else ""


def replayed_csvs(wildcards):
    """Every replayed CSV of one database (the kernel list comes from the parse checkpoint): what stage 4b maps
    the phases' calls to and what the report reads."""
    key = (wildcards.device, wildcards.stack, wildcards.version_dir)
    return ["results/{}/{}/{}/replayed/{}.csv".format(*key, kernel) for kernel in kernel_types(*key)]


def replay_budget_options(wildcards):
    """--time-budget-s and its bound as config replay.time_budget_s asks (off by default: no option)."""
    replay = config["replay"]
    if replay.get("time_budget_s") is None:
        return ""
    return f"--time-budget-s {replay['time_budget_s']} --min-repeat-count {replay['min_repeat_count']}"


def replay_power_options(wildcards):
    """--unprofiled-power as config replay.unprofiled_power asks (null by default: no option); `workload`: the
    power read from the parse stage's rows (replay_power_rows)."""
    power = config["replay"].get("unprofiled_power")
    if power == "workload":
        return f"--unprofiled-power-from {replay_power_rows(wildcards)}"
    return "" if power is None else f"--unprofiled-power {power}"


def replay_power_rows(wildcards):
    """The workload's parsed rows, whose profiled power replay.unprofiled_power: workload reads; else nothing."""
    if config["replay"].get("unprofiled_power") != "workload":
        return []
    return f"{_stage_root(wildcards)}/parsed"


def replay_prune_options(wildcards):
    """--prune-invalid-rows / --prune-empty-duration-rows as config replay.* asks (off by default)."""
    options = []
    if config["replay"].get("prune_invalid_rows"):
        options.append("--prune-invalid-rows")
    if config["replay"].get("prune_empty_duration_rows"):
        options.append("--prune-empty-duration-rows")
    return " ".join(options)


# --- comm ---


def comm_collection():
    """(device, backend, version_dir) of the collectives config `comm` benchmarks, or None (comm.enabled false)."""
    from opperf.comm.collectives import comm_version_dir

    comm = config["comm"]
    if not comm["enabled"]:
        return None
    backend = comm["backend"]
    version_dir = version_dir_from_config_or_host("comm", lambda given: given or comm_version_dir(backend))
    return (comm["device"], backend, version_dir)


def comm_collective_files(device, backend, version_dir):
    """The collective CSVs of config comm.ops in data/{device}/{backend}/{version_dir}/."""
    from opperf.comm.collectives import collective_file_name

    return [
        f"data/{device}/{backend}/{version_dir}/{collective_file_name(backend, op)}" for op in config["comm"]["ops"]
    ]


def comm_targets():
    """The collective CSVs of config `comm`, their bandwidth plot and, with comm.reference, the alignment report."""
    collection = comm_collection()
    if collection is None:
        return []
    root = "reports/{}/{}/{}".format(*collection)
    targets = comm_collective_files(*collection) + [f"{root}/busbw.png"]
    if config["comm"]["reference"]:
        targets.append(f"{root}/alignment.csv")
    return targets


def comm_collection_csvs(wildcards):
    """Inputs of the comm report rules: the collective CSVs of one collection."""
    return comm_collective_files(wildcards.device, wildcards.comm, wildcards.comm_version)


def comm_plot_runs(wildcards, input):
    """plot_comm_bandwidth.py's --run options: every CSV of the collection under the device's name."""
    return " ".join(f"--run {wildcards.device}={path}" for path in input.csvs)


def comm_link_limit_gbps(wildcards):
    """The device's interconnect_gbps (config/devices.yaml), drawn as the plot's link limit."""
    return DEVICES[wildcards.device].interconnect_gbps


def comm_link_label(wildcards):
    return DEVICES[wildcards.device].interconnect or "link limit"


def comm_reference_files(wildcards):
    """The reference collective CSVs (config comm.reference), so a changed reference re-runs the comparison."""
    return sorted(str(p) for p in Path(config["comm"]["reference"]).glob("*.csv"))


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
