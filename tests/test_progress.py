"""Progress lines: a heartbeat every period on the console and in the log, the counted task's state in
it, plain lines (no carriage returns), and nothing left running after the block."""

from __future__ import annotations

import io
import logging
import threading
import time

import pytest

from int8alibi import progress
from int8alibi.progress import Progress, heartbeat


def test_progress_counts_iteration_and_updates() -> None:
    items = Progress([1, 2, 3], desc="layers", unit="layer")
    assert items.total == 3 and list(items) == [1, 2, 3] and items.done == 3
    assert progress.status() == "running"  # finished: no longer shown
    with Progress(total=4, desc="tokens replay", unit="window") as bar:
        bar.update(1)
        bar.set_postfix_str("own window 0")
        assert progress.status() == "tokens replay: 1/4 windows (25%), own window 0"
    hidden = Progress(total=2, desc="hidden", disable=True)
    assert progress.status() == "running"
    hidden.close()


def test_a_loop_that_raises_leaves_no_task_under_way() -> None:
    def fail_at_second() -> None:
        for item in Progress([1, 2, 3], desc="failing", unit="layer"):
            if item == 2:
                raise ValueError("stop")

    with pytest.raises(ValueError):
        fail_at_second()
    assert progress.status() == "running"


def test_heartbeat_writes_a_plain_line_each_period_to_console_and_log(caplog: pytest.LogCaptureFixture) -> None:
    console = io.StringIO()
    caplog.set_level(logging.INFO, logger="int8alibi.progress")
    with heartbeat("tokens", period=0.05, console=console):
        with Progress(total=10, desc="tokens replay", unit="window") as bar:
            bar.update(3)
            time.sleep(0.3)
    lines = console.getvalue().splitlines()
    assert len(lines) >= 2 and "\r" not in console.getvalue()
    assert all(line.startswith("int8alibi tokens: ") for line in lines)
    assert "tokens replay: 3/10 windows (30%)" in lines[-1]
    assert any("int8alibi tokens: " in r.getMessage() for r in caplog.records)  # the log has them too
    assert not [t for t in threading.enumerate() if t.name == "tokens-heartbeat"]  # stopped with the block


def test_no_line_for_a_stage_shorter_than_the_period() -> None:
    console = io.StringIO()
    with heartbeat("protocol", period=5.0, console=console):
        pass
    assert console.getvalue() == ""


def test_plain_stderr_keeps_the_last_state_of_a_redrawn_line(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from int8alibi.progress import plain_stderr

    with plain_stderr():
        sys.stderr.write("start\nbar:  10%\rbar:  50%\rbar: 100%\n")
        sys.stderr.write("part")
        sys.stderr.write("ial\rdone")
    assert capsys.readouterr().err == "start\nbar: 100%\ndone\n"
