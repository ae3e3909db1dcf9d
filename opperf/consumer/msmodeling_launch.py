"""Run msmodeling's own CLI, unchanged, with a device it does not ship registered first.

    python msmodeling_launch.py MSMODELING_DIR [--device-profile FILE] -- inference text-generate MODEL_DIR …

msmodeling's CLI fixes its `--device` choices from `DeviceProfile.all_device_profiles` when it builds its parser,
and loads extra profiles only from `tensor_cast/device_profiles/` (read-only where the checkout is shared). A
`DeviceProfile` registers itself when constructed, so running the database's profile file before `cli.main.main()`
makes its device one of the choices. Standalone on purpose: it runs in msmodeling's environment, which need not
have opperf installed.
"""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 1:
        print("usage: msmodeling_launch.py MSMODELING_DIR [--device-profile FILE] -- CLI ARGUMENTS…", file=sys.stderr)
        return 2
    split = argv.index("--")
    own, cli_arguments = argv[:split], argv[split + 1:]
    checkout, profile = own[0], None
    if len(own) == 3 and own[1] == "--device-profile":
        profile = own[2]
    elif len(own) != 1:
        print(f"msmodeling_launch.py: unexpected arguments {own[1:]}", file=sys.stderr)
        return 2
    sys.path.insert(0, checkout)
    if profile is not None:
        runpy.run_path(profile, run_name="opperf_device_profile")
    from cli.main import main as msmodeling_main

    sys.argv = ["msmodeling", *cli_arguments]
    return int(msmodeling_main() or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
