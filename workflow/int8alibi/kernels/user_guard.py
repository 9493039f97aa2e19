"""The guard around a user's own arm (``module:function``): whatever the function does, the stage
ends with a result it can trust or one named error.

A user function is imported code the project does not control. It may raise, call ``sys.exit``,
hang, return the wrong thing, or write into the operands it was handed, which would give every
later comparison plausible but wrong inputs (conform's check 1 would catch that; a pipeline stage
must too). So each call gets its own copies of the operands, and afterwards they must still equal
the originals bit for bit; an exception or ``SystemExit`` becomes ``UserArmError`` naming the arm;
and each call has a time limit (``user_arm_time_limit_s`` in the config, else ``DEFAULT_TIME_LIMIT_S``).

The time limit is a real-time interval timer (``SIGALRM``), so it applies where the stage runs its
arms: the main thread of the process. It interrupts Python code and interruptible waits; a call
stuck inside native code that never returns to the interpreter is beyond any in-process limit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ..arith.bits import bits_equal
from ..errors import InputError

DEFAULT_TIME_LIMIT_S = 600.0


class UserArmError(InputError):
    """A user-supplied arm failed: raised, exited, hung past its limit, or changed its inputs."""


class _TimeUp(BaseException):
    """Raised inside the user function by the timer (a BaseException, so its own ``except Exception``
    cannot swallow it)."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        raise UserArmError("a user arm runs only in the main thread, where its time limit can be enforced")

    def expire(signum: int, frame: object) -> None:
        raise _TimeUp

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaN payloads and signed zeros included), shape, dtype and device."""
    return a.device == b.device and bits_equal(a, b)


def guarded_call(name: str, fn: Callable[..., object], operands: tuple[torch.Tensor, ...],
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> object:
    """``fn(*copies of operands)`` under the guard; the value it returned (its type is checked by the caller)."""
    copies = tuple(t.clone() for t in operands)
    try:
        with _time_limit(time_limit_s):
            out = fn(*copies)
    except _TimeUp:
        raise UserArmError(f"user arm {name}: did not return within its time limit of {time_limit_s:g} s "
                           "(user_arm_time_limit_s in the config)") from None
    except SystemExit as exc:
        raise UserArmError(f"user arm {name}: called SystemExit({exc.code!r}) instead of returning a result") from None
    except Exception as exc:  # the user's code: any failure is named, never a traceback
        raise UserArmError(f"user arm {name}: raised {type(exc).__name__}: {exc}") from None
    labels = ("a_q", "w_q", "s_a", "s_w")
    changed = [label for label, a, b in zip(labels, operands, copies) if not _same(a, b)]
    if changed:
        raise UserArmError(f"user arm {name}: wrote into its input operand(s) {', '.join(changed)}; an arm must "
                           "leave its inputs as it got them (its result is not used)")
    return out
