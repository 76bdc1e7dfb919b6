"""The forwards' bits are pinned: every architecture's logits, prompt, decode and
batched rows, equal bit for bit the recorded ones (tests/logit_pins.py) for this
kernel table. A change of arithmetic (a product picked differently, a reordered sum)
shows here; re-record only for a change meant to move the bits."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import logit_pins
import optional


@pytest.fixture(scope="module")
def got(tmp_path_factory):
    env = logit_pins.environment()
    pins = dict(np.load(logit_pins.PINS))
    mine = {k[len(env) + 1:]: v for k, v in pins.items() if k.startswith(env + "/")}
    optional.need_that("isa", bool(mine), f"no logit pins recorded for {env} "
                       f"(recorded: {sorted({k.split('/')[0] for k in pins})})")
    return mine, logit_pins.runs(logit_pins.write_files(str(tmp_path_factory.mktemp("pins"))))


@pytest.mark.parametrize("case", [c[0] for c in logit_pins.CASES])
def test_logits_are_the_pinned_bits(got, case):
    pinned, now = got
    keys = sorted(k for k in pinned if k.startswith(case + "/"))
    assert keys and keys == sorted(k for k in now if k.startswith(case + "/"))
    for k in keys:
        assert now[k].shape == pinned[k].shape, k
        same = now[k].view(np.uint32) == pinned[k].view(np.uint32)
        assert same.all(), f"{k}: {int((~same).sum())} of {same.size} values moved, " \
            f"max |diff| {float(np.max(np.abs(now[k] - pinned[k])))}"
