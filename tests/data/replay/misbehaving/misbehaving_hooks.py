"""Test hooks that misbehave on purpose: the row's first dimension picks what the replay process does.

1 → os.abort() (SIGABRT, as a kernel assertion does); 2 → sleep for an hour (a hang);
3 → os._exit(0) between rows' outcomes (a silent exit); anything else → a real torch.mm.
"""

import os
import time

import torch

from opperf.replay.inputs import ReplayCase


def build_case(row, ctx):
    first = ctx.input_shape(0)[0]
    a = ctx.tensor(ctx.input_shape(0), ctx.input_dtype(0))
    b = ctx.tensor(ctx.input_shape(1), ctx.input_dtype(1))
    if first == 1:
        return ReplayCase(fn=os.abort, description="os.abort()")
    if first == 2:
        return ReplayCase(fn=time.sleep, args=(3600,), description="time.sleep(3600)")
    return ReplayCase(fn=torch.mm, args=(a, b), description="torch.mm")
