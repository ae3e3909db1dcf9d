"""One msprof session per replay job: the command line, and finding (or exporting) what it wrote.

    msprof --output=DIR [--aic-metrics=...] python -m opperf.replay.npu.entry --execution-mode inprocess ...

msprof starts the program, profiles every device task it launches, and on exit writes
`DIR/PROF_<id>/mindstudio_profiler_output/op_summary_<timestamp>.csv` (CANN >= 7; CANN 6 wrote
`PROF_<id>/device_<n>/summary/op_summary_<n>_<model>_<iteration>.csv`). Where a PROF_* directory
holds raw data but no summary (an interrupted export), `msprof --export=on --output=PROF_<id>`
writes it. DispatchFFNCombine is a collective: its replay runs under torchrun inside the same
msprof session.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opperf.errors import OpperfError
from opperf.log import get_logger

ENTRY_MODULE = "opperf.replay.npu.entry"
EXECUTION_MODES = ("inprocess", "subprocess")
PROFILERS = ("msprof", "torch_npu")       # the timer around the replay: msprof session, or torch_npu.profiler
_SUMMARY_GLOBS = ("mindstudio_profiler_output/op_summary_*.csv", "device_*/summary/op_summary_*.csv")

log = get_logger("replay.npu.msprof")


@dataclass(frozen=True)
class TorchrunOptions:
    """How DispatchFFNCombine's replay is launched: one process per EP rank (the seed's options)."""

    ep_size: int = 16
    nproc_per_node: int | None = None      # default: ep_size / nnodes
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def processes_per_node(self) -> int:
        return self.nproc_per_node if self.nproc_per_node is not None else self.ep_size // max(self.nnodes, 1)

    def validate(self) -> None:
        """The world torchrun builds must be exactly the EP group the rows were profiled with."""
        for name in ("ep_size", "nnodes"):
            if getattr(self, name) < 1:
                raise OpperfError(f"must be >= 1, got {getattr(self, name)}",
                                  field=f"--dispatch-ffn-combine-{name.replace('_', '-')}")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise OpperfError(f"must be >= 1, got {self.nproc_per_node}",
                              field="--dispatch-ffn-combine-nproc-per-node")
        if not 0 <= self.node_rank < self.nnodes:
            raise OpperfError(f"node rank {self.node_rank} is outside 0..{self.nnodes - 1}",
                              field="--dispatch-ffn-combine-node-rank")
        if self.processes_per_node * self.nnodes != self.ep_size:
            raise OpperfError(
                f"EP size {self.ep_size} needs nproc-per-node x nnodes = {self.ep_size}, got "
                f"{self.processes_per_node} x {self.nnodes}", field="--dispatch-ffn-combine-nproc-per-node")
        if not 0 < self.master_port < 65536:
            raise OpperfError(f"port {self.master_port} is not in 1..65535",
                              field="--dispatch-ffn-combine-master-port")

    def launcher(self, python: str = sys.executable) -> list[str]:
        """The torchrun prefix (`python -m torch.distributed.run`, which is what `torchrun` runs)."""
        self.validate()
        return [python, "-m", "torch.distributed.run", f"--nproc-per-node={self.processes_per_node}",
                f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}",
                f"--master-addr={self.master_addr}", f"--master-port={self.master_port}"]


def entry_command(entry_args: Sequence[str], *, execution_mode: str = "inprocess",
                  torchrun: TorchrunOptions | None = None, python: str = sys.executable,
                  profiler_options: Sequence[str] = ()) -> list[str]:
    """The replay program a session profiles: the entry module, directly or under torchrun."""
    if execution_mode not in EXECUTION_MODES:
        raise OpperfError(f"execution mode {execution_mode!r} is not one of {EXECUTION_MODES}",
                          field="--execution-mode")
    program = torchrun.launcher(python) + ["-m", ENTRY_MODULE] if torchrun else [python, "-m", ENTRY_MODULE]
    return program + ["--execution-mode", execution_mode, *profiler_options, *entry_args]


# Characters msprof refuses in an --output path.
_MSPROF_FORBIDDEN_PATH_CHARACTERS = set("\n\f\r\b\t\v\x7f\"'\\%><|&$;`")


def msprof_command(output_dir: str | Path, program: Sequence[str], *, msprof: str = "msprof",
                   aic_metrics: str | None = None) -> list[str]:
    """`msprof --output=DIR [--aic-metrics=M] <program...>`: one session around the whole program."""
    bad = sorted(set(str(output_dir)) & _MSPROF_FORBIDDEN_PATH_CHARACTERS)
    if bad:
        raise OpperfError(f"msprof refuses output paths containing {''.join(bad)!r}: choose another directory",
                          path=output_dir)
    command = [msprof, f"--output={Path(output_dir)}"]
    if aic_metrics:
        command.append(f"--aic-metrics={aic_metrics}")
    return command + list(program)


def find_prof_dirs(root: str | Path) -> list[Path]:
    """The PROF_* directories at or under `root` (a PROF_* directory given directly counts as one)."""
    root = Path(root)
    if not root.exists():
        raise OpperfError("profiler output not found", path=root)
    if root.is_dir() and root.name.startswith("PROF_"):
        return [root]
    if not root.is_dir():
        raise OpperfError("expected a PROF_* directory or a directory containing them", path=root)
    found = sorted(p for p in root.rglob("PROF_*") if p.is_dir())
    # A PROF_* inside another PROF_* (device sub-trees never are, but be safe) belongs to the outer one.
    return [p for p in found if not any(parent in found for parent in p.parents)]


def find_op_summaries(prof_dir: str | Path) -> list[Path]:
    """The op_summary_*.csv files of one PROF_* directory (both the CANN >= 7 and the CANN 6 layout)."""
    prof_dir = Path(prof_dir)
    for pattern in _SUMMARY_GLOBS:
        files = sorted(prof_dir.glob(pattern))
        if files:
            return files
    return []


def export_summaries(prof_dir: Path, msprof: str = "msprof", timeout_s: float = 1800) -> None:
    """Ask msprof to (re)write the summary tables of a PROF_* directory holding raw data only."""
    command = [msprof, "--export=on", f"--output={prof_dir}"]
    log.info("exporting summaries: %s", subprocess.list2cmdline(command))
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise OpperfError(f"{msprof} not found; cannot export {prof_dir}", path=prof_dir) from exc
    except subprocess.TimeoutExpired as exc:
        raise OpperfError(f"msprof --export did not finish within {timeout_s:.0f}s", path=prof_dir) from exc
    if completed.returncode != 0:
        raise OpperfError(f"msprof --export exited with {completed.returncode}: "
                          f"{(completed.stderr or completed.stdout).strip()[-500:]}", path=prof_dir)


def collect_op_summaries(root: str | Path, *, msprof: str | None = None) -> list[Path]:
    """Every op_summary file under `root`'s PROF_* directories, exporting them first where missing.

    `msprof=None` never runs msprof (parsing an existing `--prof-path` on a host without CANN).
    """
    prof_dirs = find_prof_dirs(root)
    if not prof_dirs:
        raise OpperfError("no PROF_* directory: msprof wrote nothing (did the replay launch any kernel?)",
                          path=root)
    files: list[Path] = []
    for prof_dir in prof_dirs:
        summaries = find_op_summaries(prof_dir)
        if not summaries and msprof is not None:
            export_summaries(prof_dir, msprof)
            summaries = find_op_summaries(prof_dir)
        if not summaries:
            raise OpperfError("no op_summary_*.csv under mindstudio_profiler_output/ or device_*/summary/ "
                              "(export it with `msprof --export=on --output=<this directory>`)", path=prof_dir)
        files.extend(summaries)
    return files
