"""Where msmodeling is and how to run it: its checkout (`$OPPERF_MSMODELING_DIR`, else `../shared/msmodeling` beside
the project where that exists), the Python that imports it (`$OPPERF_MSMODELING_PYTHON`, else this one) and the
commit a database records."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from opperf.errors import OpperfError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The pinned copy CI lays beside the project (read-only there); users have their own checkout.
SHARED_CHECKOUT = PROJECT_ROOT.parent / "shared" / "msmodeling"
LAUNCHER = Path(__file__).with_name("msmodeling_launch.py")
_SNAPSHOT_COMMIT = re.compile(r"\bCommit\s+([0-9a-f]{40})\b")


@dataclass(frozen=True)
class Msmodeling:
    directory: Path
    python: str
    commit: str | None
    commit_source: str      # "git" | "SNAPSHOT.md" | "unknown"
    found_by: str           # "argument" | "OPPERF_MSMODELING_DIR" | "../shared/msmodeling"

    def describe(self) -> str:
        commit = f"{self.commit[:12]} ({self.commit_source})" if self.commit else "commit unknown"
        return f"msmodeling {commit} at {self.directory} (found by {self.found_by}), Python {self.python}"


def find_msmodeling(explicit: str | Path | None = None) -> Msmodeling | None:
    """The msmodeling checkout to use, or None where there is none: an explicit directory (an error if it is not
    a checkout), `$OPPERF_MSMODELING_DIR`, else the pinned copy beside the project."""
    if explicit:
        directory, found_by = Path(explicit), "argument"
    elif os.environ.get("OPPERF_MSMODELING_DIR"):
        directory, found_by = Path(os.environ["OPPERF_MSMODELING_DIR"]), "OPPERF_MSMODELING_DIR"
    elif (SHARED_CHECKOUT / "tensor_cast").is_dir():
        directory, found_by = SHARED_CHECKOUT, "../shared/msmodeling"
    else:
        return None
    if not (directory / "tensor_cast").is_dir() or not (directory / "cli" / "main.py").is_file():
        raise OpperfError(f"{directory} is not a msmodeling checkout (it has no tensor_cast/ and cli/main.py)",
                          field=found_by)
    commit, source = msmodeling_commit(directory)
    python = os.environ.get("OPPERF_MSMODELING_PYTHON") or sys.executable
    return Msmodeling(directory.resolve(), python, commit, source, found_by)


def msmodeling_commit(directory: Path) -> tuple[str | None, str]:
    """The checkout's commit: `git rev-parse HEAD` where it is a git work tree, else the one its SNAPSHOT.md names
    (the pinned copy is not a repository)."""
    done = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False)
    if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", done.stdout.strip()) and (
            Path(subprocess.run(["git", "-C", str(directory), "rev-parse", "--show-toplevel"], capture_output=True,
                                text=True, check=False).stdout.strip() or "/").resolve() == directory.resolve()):
        return done.stdout.strip(), "git"
    snapshot = directory / "SNAPSHOT.md"
    if snapshot.is_file():
        found = _SNAPSHOT_COMMIT.search(snapshot.read_text(encoding="utf-8"))
        if found:
            return found.group(1), "SNAPSHOT.md"
    return None, "unknown"


def cli_command(install: Msmodeling, device_profile: str | Path | None, arguments: list[str]) -> list[str]:
    """msmodeling's own CLI (`cli.main.main()`, unchanged) through the launcher, which registers the database's
    DeviceProfile first: `python msmodeling_launch.py DIR [--device-profile FILE] -- inference text-generate …`."""
    command = [install.python, str(LAUNCHER), str(install.directory)]
    if device_profile is not None:
        command += ["--device-profile", str(device_profile)]
    return [*command, "--", *arguments]


def run_cli(install: Msmodeling, device_profile: str | Path | None, arguments: list[str], *,
            cwd: str | Path | None = None, timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """Run msmodeling's CLI and return what it printed; a non-zero exit is an error quoting its last lines."""
    command = cli_command(install, device_profile, arguments)
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise OpperfError(f"msmodeling's CLI failed (exit {done.returncode}): {' '.join(arguments)}\n{tail}",
                          path=install.directory)
    return done


def model_directory(model_dir_or_config: str | Path, work: str | Path) -> Path:
    """The directory msmodeling's runner takes for a model (one holding config.json): the given one, or, for a
    config.json file, `work/model` with the file laid into it."""
    from opperf.workload.transformers_model import CONFIG_NAME

    path = Path(model_dir_or_config)
    if path.is_dir():
        return path
    model_dir = Path(work) / "model"
    model_dir.mkdir()
    shutil.copyfile(path, model_dir / CONFIG_NAME)
    return model_dir


def runner_options(device: str, tp: int, quantize_linear: str, layers: int | None) -> list[str]:
    """text-generate's options for a model's device, tensor parallelism (--num-devices, --tp-size: one rank's share),
    linear-layer quantization and --num-hidden-layers-override (None: the model's own depth)."""
    return ["--device", device, "--num-devices", str(tp), "--tp-size", str(tp), "--quantize-linear-action",
            quantize_linear, *(["--num-hidden-layers-override", str(layers)] if layers else [])]
