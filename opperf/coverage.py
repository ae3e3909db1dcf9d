"""Which kernel types a back end replays, and why the others are not: one machine-readable answer.

Every kernel type a real deployment reports either has a definition under `config/kernels/<family>/`
(as its own Type or as an alternate, e.g. `AddAiCore` of `Add`) or an entry in `config/not_replayed.yaml`
saying why no definition can exist (a communication kernel the collectives stage measures, a kernel CANN
launches inside another op, ...). The report and op_mapping.yaml read the reasons from here; a test checks
the observed list of `resources/ascend/observed_kernel_types.tsv` is fully accounted for. Imports no torch.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import yaml

from opperf.errors import OpperfError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_NOT_REPLAYED = REPO / "config" / "not_replayed.yaml"
OBSERVED_ASCEND_TYPES = REPO / "resources" / "ascend" / "observed_kernel_types.tsv"
# Why a kernel type has no replay definition.
REASONS = {
    "communication": "a collective: measured by the comm stage (message size x ranks), not per shape",
    "runtime_internal": "launched by CANN/aclnn inside another op's call; no API launches it alone",
    "no_entry_point": "no public torch / torch_npu / vLLM-Ascend function launches it with row-derived inputs",
    "not_yet_defined": "an API launches it, but its definition is not written yet (the detail says what is missing)",
}


@dataclass(frozen=True)
class NotReplayed:
    kernel_type: str
    reason: str          # a key of REASONS
    detail: str          # why, for this kernel type


def load_not_replayed(path: str | Path | None = None) -> dict[str, dict[str, NotReplayed]]:
    """back end -> kernel type -> why it is not replayed (errors name the file and the field)."""
    path = Path(path) if path is not None else DEFAULT_NOT_REPLAYED
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise OpperfError(f"cannot read: {exc.strerror}", path=path) from exc
    except yaml.YAMLError as exc:
        raise OpperfError(f"not valid YAML: {exc}", path=path) from exc
    if not isinstance(document, dict):
        raise OpperfError("must map a back end to its kernel types", path=path)
    result: dict[str, dict[str, NotReplayed]] = {}
    for backend, entries in document.items():
        if not isinstance(entries, dict):
            raise OpperfError("must map kernel types to {reason, detail}", path=path, field=str(backend))
        for kernel_type, entry in entries.items():
            field_name = f"{backend}.{kernel_type}"
            if not isinstance(entry, dict) or set(entry) != {"reason", "detail"}:
                raise OpperfError("needs exactly `reason` and `detail`", path=path, field=field_name)
            if entry["reason"] not in REASONS:
                raise OpperfError(f"reason {entry['reason']!r} is not one of {sorted(REASONS)}", path=path,
                                  field=f"{field_name}.reason")
            if not isinstance(entry["detail"], str) or not entry["detail"].strip():
                raise OpperfError("say why, in a sentence", path=path, field=f"{field_name}.detail")
            result.setdefault(str(backend), {})[str(kernel_type)] = NotReplayed(str(kernel_type), entry["reason"],
                                                                                  entry["detail"].strip())
    return result


def observed_kernel_types(path: str | Path = OBSERVED_ASCEND_TYPES) -> dict[str, list[str]]:
    """kernel type -> the version directories whose deployments reported it (the TSV of 1s)."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader)
        return {row[0]: [header[i] for i in range(1, len(header)) if i < len(row) and row[i].strip() == "1"]
                for row in reader if row}


@dataclass(frozen=True)
class Coverage:
    """One observed kernel type: the definition that replays it (own Type or alternate), or why none does."""

    kernel_type: str
    definition: str | None            # the definition's own Type
    not_replayed: NotReplayed | None


def coverage(kernel_types, definitions: dict, not_replayed: dict[str, NotReplayed], backend: str = "npu"
             ) -> list[Coverage]:
    """Account for each kernel type; a type with both a definition and a reason, or neither, is an error."""
    from opperf.replay.definitions import definition_for

    result = []
    for kernel_type in kernel_types:
        definition = definition_for(definitions, kernel_type, backend)
        reason = not_replayed.get(kernel_type)
        if definition is not None and reason is not None:
            raise OpperfError(f"{kernel_type} has a definition ({definition.path}) and a not-replayed reason",
                              path=DEFAULT_NOT_REPLAYED, field=f"{backend}.{kernel_type}")
        result.append(Coverage(kernel_type, definition.type if definition else None, reason))
    return result
