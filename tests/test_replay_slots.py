"""Device slots: concurrent jobs get distinct device ids; a slot frees itself when its holder ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from opperf.errors import OpperfError
from opperf.replay.slots import device_slot, parse_device_ids, visible_devices_env


def test_concurrent_holders_get_distinct_ids_and_a_full_set_waits(tmp_path):
    with device_slot("cuda", [0, 1], tmp_path) as first:
        with device_slot("cuda", [0, 1], tmp_path) as second:
            assert {first, second} == {0, 1}
            with pytest.raises(OpperfError, match="no free cuda device among"):
                with device_slot("cuda", [0, 1], tmp_path, wait_timeout_s=0.3, poll_s=0.05):
                    pass
        with device_slot("cuda", [0, 1], tmp_path) as again:
            assert again == second          # released on exit
    assert visible_devices_env("cuda", 1) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert visible_devices_env("npu", 3) == {"ASCEND_RT_VISIBLE_DEVICES": "3"}
    assert visible_devices_env("cpu", None) == {}


def test_a_killed_holder_releases_its_slot(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(__import__('opperf').__path__[0] + '/..')!r})
        from opperf.replay.slots import device_slot
        with device_slot("npu", [5], {str(tmp_path)!r}) as slot:
            print(slot, flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "5"
    with pytest.raises(OpperfError):
        with device_slot("npu", [5], tmp_path, wait_timeout_s=0.2, poll_s=0.05):
            pass
    holder.kill()
    holder.wait()
    start = time.monotonic()
    with device_slot("npu", [5], tmp_path, wait_timeout_s=5, poll_s=0.05) as slot:
        assert slot == 5 and time.monotonic() - start < 5


def test_device_ids_are_parsed_strictly():
    assert parse_device_ids("0, 2,3") == [0, 2, 3]
    for bad in ("0,0", "a", "-1", ""):
        with pytest.raises(OpperfError):
            parse_device_ids(bad)
