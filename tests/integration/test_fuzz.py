"""A bounded run of the hostile-input fuzzer (tests/fuzz/amqp_fuzz.py, issue 15).

`make fuzz DURATION=...` runs it for longer; here a fixed seed and case count keep the
run deterministic in what it sends and well under the suite's time budget: `FUZZ_CASES`
(default 1,500 AMQP conversations, a tenth as many SASL ones); `make test-long` (CI) runs
6,000.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fuzz.amqp_fuzz import fuzz

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]  # 1 s answers
CASES = int(os.environ.get("FUZZ_CASES", "1500"))


@pytest.mark.timeout(90 + CASES // 50)
def test_fuzzed_amqp_frames_never_crash_or_hang_the_broker(tmp_path: Path) -> None:
    """Issue 15, security off: CASES mutated conversations; the broker stays up, closes
    every malformed connection within 1 s, logs no unexpected exception, and keeps
    serving a normal client (a round trip every 100 cases)."""
    summary = fuzz(tmp_path, sasl=False, seed=15, max_cases=CASES, log=lambda line: None)
    assert summary.cases == CASES
    assert (summary.crashes, summary.unexpected, summary.unanswered) == (0, 0, 0), "\n".join(
        summary.failures[:5]
    )


@pytest.mark.timeout(90 + CASES // 50)
def test_fuzzed_sasl_frames_never_crash_or_hang_the_broker(tmp_path: Path) -> None:
    """Issue 15, security on with a PLAIN user: SASL frames (init mutated, junk in place
    of the others) before the same AMQP conversations. Each case authenticates (scrypt),
    so fewer cases."""
    summary = fuzz(tmp_path, sasl=True, seed=15, max_cases=CASES // 10, log=lambda line: None)
    assert summary.cases == CASES // 10
    assert (summary.crashes, summary.unexpected, summary.unanswered) == (0, 0, 0), "\n".join(
        summary.failures[:5]
    )
