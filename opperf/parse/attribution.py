"""How much of a profile's time became rows, what the rest was, and which launches are communication.

Every profile the parse reads gets an account: a torch.profiler trace of its device time (every kernel, memcpy and
memset), a kernel table (kernel_details, op_summary) of its rows' summed Duration(us). The share is what the
written CSVs hold; every part that is not in them is named with its µs and activity count (collectives, compiled
regions, launches no op records, rows the parse skipped). `trace_attribution.json` beside the CSVs keeps the
accounts; the parse prints them, at WARNING where more than ATTRIBUTION_WARN_SHARE is not in rows.

Collectives are measured by the comm stage (message size × ranks), never as compute rows: NCCL/RCCL kernels by
their name, and what communication ops (`record_param_comms`, `c10d::*`, `_c10d_functional::*`, `nccl:*`,
`gloo:*`) launch, in traces; `hcom_*` rows (and the same names) in kernel tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Parts not in any row above this share of the profile's time are logged at WARNING.
ATTRIBUTION_WARN_SHARE = 0.05

DEVICE_TIME = "device time"            # a trace: every kernel, memcpy and memset
KERNEL_TIME = "kernel time"            # a kernel table: its rows' Duration(us), summed

COLLECTIVES = ("collectives (NCCL/RCCL kernels and the copies communication ops launch): measured by the comm "
               "stage, not compute rows")
SKIPPED_PREFIX = "rows the parse skipped: "     # + the aggregator's skip reason

# Lower-case substrings of collective kernel names (ncclKernel_*, ncclDevKernel_*, RCCL's, MSCCL's).
COLLECTIVE_KERNEL_MARKERS = ("nccl", "rccl", "msccl")
# Op namespaces whose ops are collectives, as a trace names them (`c10d::allreduce_`) and as a Type (`c10d.x`).
COLLECTIVE_NAMESPACES = frozenset({"c10d", "c10d_functional", "_c10d_functional", "_c10d_functional_autograd"})
COLLECTIVE_OPS = frozenset({"record_param_comms"})
COLLECTIVE_PREFIXES = ("nccl:", "gloo:", "hccl:", "ucc:", "mpi:", "hcom_")


def is_collective_kernel(kernel_name: str) -> bool:
    """An NCCL/RCCL kernel, by the name the device activity carries."""
    lowered = kernel_name.lower()
    return any(marker in lowered for marker in COLLECTIVE_KERNEL_MARKERS)


def is_collective_op(name: str) -> bool:
    """A communication op, by its trace name (`c10d::allreduce_`, `record_param_comms`, `nccl:all_reduce`) or its
    Type (`c10d.allreduce_`, `hcom_allReduce_`)."""
    lowered = name.lower()
    if lowered.startswith(COLLECTIVE_PREFIXES) or name in COLLECTIVE_OPS:
        return True
    namespace, separator, _ = name.partition("::")
    if not separator:
        namespace, separator, _ = name.partition(".")
    return bool(separator) and namespace in COLLECTIVE_NAMESPACES


def is_collective_type(kernel_type: str) -> bool:
    """A Type that is a collective: a communication op or an NCCL/RCCL kernel named as its own Type."""
    return is_collective_op(kernel_type) or is_collective_kernel(kernel_type)


@dataclass
class Attribution:
    """How much of one profile's time became rows, and what the rest was (µs and activities per kind)."""

    device_us: float = 0.0                 # the profile's whole time (see `measure`)
    rows_us: float = 0.0                   # ... of which in the rows written
    unattributed: dict[str, list[float]] = field(default_factory=dict)   # kind -> [µs, activities]
    measure: str = DEVICE_TIME

    @property
    def share(self) -> float | None:
        return self.rows_us / self.device_us if self.device_us else None

    @property
    def large(self) -> bool:
        """More than ATTRIBUTION_WARN_SHARE of the time is in no row."""
        return bool(self.device_us) and (self.device_us - self.rows_us) > ATTRIBUTION_WARN_SHARE * self.device_us

    def add(self, kind: str, duration_us: float, activities: int = 1) -> None:
        entry = self.unattributed.setdefault(kind, [0.0, 0])
        entry[0] += duration_us
        entry[1] += activities

    def skipped(self, reason: str, duration_us: float, rows: int) -> None:
        """Rows the aggregator skipped (their time was counted as rows when the profile was read)."""
        self.rows_us -= duration_us
        self.add(SKIPPED_PREFIX + reason, duration_us, rows)

    def lines(self) -> list[str]:
        if not self.device_us:
            return []
        lines = [f"{100 * self.share:.2f} % of the {'trace' if self.measure == DEVICE_TIME else 'profile'}'s "
                 f"{self.measure} ({self.rows_us:.1f} of {self.device_us:.1f} us) became rows"]
        for kind, (duration, count) in sorted(self.unattributed.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"not in any row: {duration:.1f} us ({100 * duration / self.device_us:.2f} %) in "
                         f"{int(count)} {kind}")
        return lines

    def to_json(self) -> dict:
        return {"measure": self.measure, "device_us": round(self.device_us, 3), "rows_us": round(self.rows_us, 3),
                "share": None if self.share is None else round(self.share, 6),
                "unattributed": {k: {"us": round(v[0], 3), "activities": int(v[1])}
                                 for k, v in sorted(self.unattributed.items())}}
