"""A user's ``module:function`` arm runs in a worker process behind ``user_guard``: whatever the function
does there (raise ``KeyboardInterrupt``, change the working directory, ignore ``SIGALRM`` and spin, end
the process with ``os._exit``, die by a signal, write into its operands, return the wrong thing), the
caller gets the function's bytes or one ``UserArmError`` line naming the arm and the reason, and the
caller's process, working directory and operands are untouched. The worker ends with its arm and with
the process that started it.

The planted arms are a module written into a temporary folder (importing it costs the worker nothing
beyond torch, which it has already), so the time limits here are small.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import torch

from int8alibi.kernels import registry
from int8alibi.kernels.exact import ExactArm
from int8alibi.kernels.user_guard import UserArmError

LIMIT = 1.0
PLANTED = '''
import os
import signal
import sys

from int8alibi.kernels.exact import ExactArm


def good(a_q, w_q, s_a, s_w):
    return ExactArm("cutlass", a_q.device).scaled_mm(a_q, w_q, s_a, s_w)


def moves(a_q, w_q, s_a, s_w):
    os.chdir("/")
    return good(a_q, w_q, s_a, s_w)


def raises(*_):
    raise ValueError("bad kernel")


def interrupts(*_):
    raise KeyboardInterrupt


class Odd(BaseException):
    def __str__(self):
        raise RuntimeError("no message either")


def odd(*_):
    raise Odd


def exits(*_):
    sys.exit(0)


def deaf(*_):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # the stage's old in-process limit could not stop this
    while True:
        pass


def quits(*_):
    os._exit(0)


def crashes(*_):
    os.kill(os.getpid(), signal.SIGKILL)


def overwrites(a_q, w_q, s_a, s_w):
    out = good(a_q, w_q, s_a, s_w)
    a_q.zero_()
    return out


def where(*_):
    import int8alibi
    raise ValueError(int8alibi.__file__)


def float32(a_q, w_q, s_a, s_w):
    return good(a_q, w_q, s_a, s_w).float()

'''
ON_IMPORT = {
    "exits_on_import": ("import sys\nsys.exit(3)\n", "arm 'exits_on_import:f': cannot import module "
                        "exits_on_import: SystemExit: 3"),
    "interrupts_on_import": ("raise KeyboardInterrupt\n", "arm 'interrupts_on_import:f': cannot import module "
                             "interrupts_on_import: KeyboardInterrupt"),
    "quits_on_import": ("import os\nos._exit(0)\n", "user arm quits_on_import:f: its process ended (exit status 0) "
                        "while importing its module"),
    "hangs_on_import": ("while True:\n    pass\n", f"user arm hangs_on_import:f: its module did not import within "
                        f"its time limit of {LIMIT:g} s (user_arm_time_limit_s in the config); its process was killed"),
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The planted arms' module name, importable here and so in the worker (it gets this sys.path)."""
    folder = tmp_path_factory.mktemp("planted")
    (folder / "planted_arms.py").write_text(PLANTED)
    for name, (source, _) in ON_IMPORT.items():
        (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    yield "planted_arms"
    sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def arms(planted: str) -> dict[str, registry.UserArm]:
    """The planted arms built so far, by name: each worker starts once for the module's tests."""
    return {}


def operands() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    a_q = torch.randint(-127, 128, (4, 32), dtype=torch.int8, generator=g)
    w_q = torch.randint(-128, 128, (16, 32), dtype=torch.int8, generator=g)
    s_a = torch.rand(4, generator=g) / 100 + 1e-3
    s_w = torch.rand(16, generator=g) / 100 + 1e-3
    return a_q, w_q, s_a, s_w


def exact(*ops: torch.Tensor) -> torch.Tensor:
    return ExactArm("cutlass", torch.device("cpu")).scaled_mm(*ops)


def build(planted: str, name: str, limit: float = LIMIT) -> registry.UserArm:
    built = registry.get(f"{planted}:{name}", "cpu", user_time_limit_s=limit)
    assert isinstance(built, registry.UserArm)
    return built


def arm(planted: str, arms: dict[str, registry.UserArm], name: str) -> registry.UserArm:
    if name not in arms:
        arms[name] = build(planted, name)
    return arms[name]


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie awaiting its parent's wait counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_well_behaved_user_arm_gives_its_bytes_from_its_own_process(planted: str, arms: dict) -> None:
    ops = operands()
    kept = tuple(t.clone() for t in ops)
    user = arm(planted, arms, "good")
    assert user._process.pid != os.getpid() and alive(user._process.pid)
    for _ in range(2):  # one worker answers every call
        assert torch.equal(user.scaled_mm(*ops).view(torch.int16), exact(*ops).view(torch.int16))
    assert all(torch.equal(a, b) for a, b in zip(ops, kept))
    assert user.evidence()["implementation"].endswith("planted_arms.py)")


def test_a_user_arm_that_changes_its_working_directory_changes_only_its_own(planted: str, arms: dict) -> None:
    here = os.getcwd()
    user, ops = arm(planted, arms, "moves"), operands()
    for _ in range(2):
        assert torch.equal(user.scaled_mm(*ops).view(torch.int16), exact(*ops).view(torch.int16))
        assert os.getcwd() == here


@pytest.mark.parametrize("name, words", [
    ("raises", "raised ValueError: bad kernel"),
    ("interrupts", "raised KeyboardInterrupt"),
    ("odd", "raised Odd: (its message cannot be printed)"),
    ("exits", "called SystemExit(0) instead of returning a result"),
    ("deaf", f"did not return within its time limit of {LIMIT:g} s (user_arm_time_limit_s in the config); "
             "its process was killed"),
    ("quits", "its process ended (exit status 0) instead of returning a result"),
    ("crashes", "its process ended (killed by SIGKILL) instead of returning a result"),
    ("overwrites", "wrote into its input operand(s) a_q; an arm must leave its inputs as it got them"),
    ("float32", "returned torch.float32 (4, 16), expected torch.bfloat16 [4, 16]"),
])
def test_a_misbehaving_user_arm_is_one_named_line_and_leaves_the_caller_as_it_was(
        planted: str, arms: dict, name: str, words: str) -> None:
    here, ops = os.getcwd(), operands()
    kept = tuple(t.clone() for t in ops)
    user = arm(planted, arms, name)
    started = time.monotonic()
    with pytest.raises(UserArmError) as caught:
        user.scaled_mm(*ops)
    message = str(caught.value)
    assert message.startswith(f"user arm {planted}:{name}: ") and words in message, message
    assert "\n" not in message
    assert time.monotonic() - started < LIMIT + 10
    assert os.getcwd() == here and all(torch.equal(a, b) for a, b in zip(ops, kept))


def test_the_worker_runs_the_package_the_caller_imported(planted: str, arms: dict) -> None:
    import int8alibi

    with pytest.raises(UserArmError) as caught:
        arm(planted, arms, "where").scaled_mm(*operands())
    assert str(caught.value) == f"user arm {planted}:where: raised ValueError: {int8alibi.__file__}"


@pytest.mark.parametrize("name", ["deaf", "quits"])
def test_a_worker_that_is_gone_is_never_asked_again(planted: str, arms: dict, name: str) -> None:
    user = arm(planted, arms, name)
    with pytest.raises(UserArmError) as first:
        user.scaled_mm(*operands())
    assert not alive(user._process.pid)
    started = time.monotonic()
    with pytest.raises(UserArmError) as again:
        user.scaled_mm(*operands())
    assert str(again.value) == str(first.value) and time.monotonic() - started < 1


def test_a_worker_that_answered_with_a_reason_keeps_serving(planted: str, arms: dict) -> None:
    user = arm(planted, arms, "raises")
    for _ in range(2):
        with pytest.raises(UserArmError, match="raised ValueError: bad kernel"):
            user.scaled_mm(*operands())
    assert alive(user._process.pid)


@pytest.mark.parametrize("module", sorted(ON_IMPORT))
def test_a_module_that_misbehaves_on_import_is_named(planted: str, module: str) -> None:
    with pytest.raises(UserArmError) as caught:
        registry.get(f"{module}:f", "cpu", user_time_limit_s=LIMIT)
    assert str(caught.value) == ON_IMPORT[module][1]


class _Interrupted(BaseException):
    """What the caller's own signal handler raises (standing in for Ctrl-C without touching SIGINT)."""


def test_an_interrupted_caller_kills_the_worker(planted: str) -> None:
    user = build(planted, "deaf", limit=60)

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = subprocess.Popen([sys.executable, "-c", f"import os, signal, time; time.sleep(1); "
                                                    f"os.kill({os.getpid()}, signal.SIGUSR1)"])
    try:
        with pytest.raises(_Interrupted):
            user.scaled_mm(*operands())
    finally:
        timer.wait()
        signal.signal(signal.SIGUSR1, previous)
    deadline = time.monotonic() + 10
    while alive(user._process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(user._process.pid)
    with pytest.raises(UserArmError, match="interrupted; its process was killed"):
        user.scaled_mm(*operands())


def test_the_worker_ends_with_its_arm(planted: str) -> None:
    user = build(planted, "good")
    pid = user._process.pid
    del user
    gc.collect()
    assert not alive(pid)


def test_the_worker_ends_with_the_process_that_started_it(planted: str) -> None:
    """The stage killed outright (SIGKILL: no cleanup of its own runs) takes a spinning worker with it."""
    folder = next(entry for entry in sys.path if os.path.isfile(os.path.join(entry, f"{planted}.py")))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {folder!r})
        from int8alibi.kernels import registry
        user = registry.get("{planted}:deaf", "cpu", user_time_limit_s=600)
        print(user._process.pid, flush=True)
        import torch
        user.scaled_mm(torch.zeros(1, 16, dtype=torch.int8), torch.zeros(1, 16, dtype=torch.int8),
                       torch.ones(1), torch.ones(1))
    """)
    stage = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(stage.stdout.readline())  # type: ignore[union-attr]
        time.sleep(0.5)  # the worker is spinning in the arm now
        assert alive(worker)
    finally:
        stage.kill()
        stage.wait()
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker)
