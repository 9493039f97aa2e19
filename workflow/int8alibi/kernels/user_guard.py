"""The boundary around a user's own arm (``module:function``): whatever the function does, the stage
ends with a result it can trust or one named error.

A user function is code the project does not control. In the stage's own process it could raise
``KeyboardInterrupt``, change the working directory under the stage, ignore ``SIGALRM`` and so outlive
any time limit kept in that process, or end the process with ``os._exit``. So a user arm runs in a
worker process of its own (``UserProcess``: ``python -m int8alibi.kernels``, which runs ``serve``),
and the stage only ever reads what the worker sends back over a socket:

* the worker imports the module, and for each call rebuilds the operands from their bytes, hands the
  function copies, and sends back the result's bytes only when the copies still equal the operands bit
  for bit and the result is a ``torch.bfloat16 [M, N]`` tensor on the operands' device; otherwise one
  reason (an exception of any kind, ``SystemExit`` included, is one);
* the stage holds the time limit (``user_arm_time_limit_s`` in the config, else ``DEFAULT_TIME_LIMIT_S``)
  for the import and for each call: a timer thread kills the worker's whole process group when it
  runs out, which nothing the worker does can prevent;
* a worker that ends without answering (``os._exit``, a signal, a crash in native code) is named by
  its exit status, and a worker outlives neither its arm nor the stage's process (``PR_SET_PDEATHSIG``).

Every failure is a ``UserArmError`` naming the arm and the reason, and a worker that failed other than
by answering with a reason is never asked again. The worker computes under the stage's torch settings
(``TORCH_SETTINGS``) and environment, so a result has the bytes the function gives in the stage.
Built-in arms stay in the stage's process; only a user arm crosses this boundary.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..arith.bits import bits_equal
from ..errors import InputError

T = TypeVar("T")
DEFAULT_TIME_LIMIT_S = 600.0
START_LIMIT_S = 300.0  # the worker's interpreter and torch, before any of the user's code runs
_HEADER_BYTES = 1 << 20
_REASON_CHARS = 2000
_LABELS = ("a_q", "w_q", "s_a", "s_w")
_DTYPES = {"int8": torch.int8, "float32": torch.float32}
_PR_SET_PDEATHSIG = 1
# torch settings that move float bytes, read in the stage and set in the worker (name: (get, set))
TORCH_SETTINGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "mkldnn": (lambda: bool(torch.backends.mkldnn.enabled), lambda v: setattr(torch.backends.mkldnn, "enabled", v)),
    "threads": (torch.get_num_threads, torch.set_num_threads),
    "deterministic": (torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    "matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "cudnn_tf32": (lambda: bool(torch.backends.cudnn.allow_tf32),
                   lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
}


class UserArmError(InputError):
    """A user-supplied arm failed: raised, exited, hung past its limit, changed its inputs or returned
    the wrong thing."""


class _Gone(Exception):
    """The worker did not answer: it ended, was killed, or sent something that is not the protocol."""


def _send(conn: Connection, header: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(header).encode())


def _receive(conn: Connection) -> dict[str, Any]:
    try:
        header = json.loads(conn.recv_bytes(_HEADER_BYTES))
    except (EOFError, OSError, ValueError) as exc:
        raise _Gone(str(exc) or type(exc).__name__) from None
    if not isinstance(header, dict):
        raise _Gone("a message that is not a JSON object")
    return header


def _raw(t: torch.Tensor) -> Any:
    """The tensor's bytes as a buffer (a CPU copy only where it is not already a contiguous CPU tensor)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def _receive_into(conn: Connection, t: torch.Tensor) -> torch.Tensor:
    """Fill the new CPU tensor ``t`` with the next message, which must be exactly its bytes."""
    buffer = t.reshape(-1).view(torch.uint8).numpy()
    try:
        got = conn.recv_bytes_into(buffer)
    except (EOFError, OSError) as exc:  # BufferTooShort (more bytes than the tensor holds) is an OSError
        raise _Gone(str(exc) or type(exc).__name__) from None
    if got != buffer.nbytes:
        raise _Gone(f"{got} bytes where {buffer.nbytes} were due")
    return t


def describe(exc: BaseException) -> str:
    """``Type: message`` (``Type`` alone without one) of anything the user's code raised, even where its
    ``str`` itself fails."""
    try:
        text = str(exc)
    except BaseException:  # the user's exception type: its __str__ is its own code too
        text = "(its message cannot be printed)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _status(code: int) -> str:
    """A process's end as words: its exit status, or the signal that killed it."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:  # a signal without a name (a real-time one)
        return f"killed by signal {-code}"


class UserProcess:
    """One user arm's worker process, seen from the stage: started and its module imported on
    construction, then ``call`` once per operand set; ``UserArmError`` for every failure."""

    def __init__(self, spec: str, time_limit_s: float) -> None:
        self.spec, self.time_limit_s = spec, time_limit_s
        self._failed: str | None = None
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair()
        # the worker runs this package's code, wherever the stage imported it from
        here = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))
        with ours, theirs:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", __package__, str(theirs.fileno()), str(os.getpid())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": here})
            except OSError as exc:
                raise UserArmError(f"user arm {spec}: its worker process cannot be started: {exc}") from None
            self._conn = Connection(ours.detach())
        self._stop = weakref.finalize(self, _stop, self._proc, self._conn)
        self.pid = self._proc.pid  # the worker's process id, for the stage's log
        try:
            self._within(START_LIMIT_S, f"its worker process did not start within {START_LIMIT_S:g} s",
                         "before it was ready (its own error, if any, is on stderr above)", self._started)
            self.source = self._within(
                time_limit_s, f"its module did not import within its time limit of {time_limit_s:g} s "
                "(user_arm_time_limit_s in the config)", "while importing its module", self._imported)
        except BaseException:
            self._stop()
            raise

    def _started(self) -> None:
        path = [entry or os.getcwd() for entry in sys.path]  # '' is the stage's working directory now
        _send(self._conn, {"spec": self.spec, "path": path,
                           "torch": {name: get() for name, (get, _) in TORCH_SETTINGS.items()}})
        if "started" not in _receive(self._conn):
            raise _Gone("no start message")

    def _imported(self) -> str:
        reply = _receive(self._conn)
        if "error" in reply:
            raise UserArmError(str(reply["error"]))
        return str(reply.get("source", "unknown"))

    def call(self, operands: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The function's ``torch.bfloat16 [M, N]`` result for ``(a_q, w_q, s_a, s_w)``, on their device."""
        with self._lock:
            return self._within(self.time_limit_s, f"did not return within its time limit of {self.time_limit_s:g} "
                                "s (user_arm_time_limit_s in the config)", "instead of returning a result",
                                lambda: self._call(operands))

    def _call(self, operands: tuple[torch.Tensor, ...]) -> torch.Tensor:
        _send(self._conn, {"device": str(operands[0].device),
                           "operands": [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in operands]})
        for t in operands:
            self._conn.send_bytes(_raw(t))
        reply = _receive(self._conn)
        if "error" in reply:
            raise UserArmError(f"user arm {self.spec}: {reply['error']}")
        out = torch.empty((operands[0].shape[0], operands[1].shape[0]), dtype=torch.bfloat16)
        return _receive_into(self._conn, out).to(operands[0].device)

    def _within(self, limit: float, late: str, gone: str, exchange: Callable[[], T]) -> T:
        """``exchange()`` with the worker under a wall-clock limit that a timer thread enforces by killing
        it. An answer with a reason leaves the worker in service; a worker that ran late, ended, broke the
        protocol or was interrupted is gone, and the arm fails with the same line from then on."""
        if self._failed is not None:
            raise UserArmError(self._failed)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _kill(self._proc)

        timer = threading.Timer(limit, expire)
        timer.daemon = True
        timer.start()
        try:
            result = exchange()
        except UserArmError:
            raise
        except (_Gone, OSError) as exc:
            timer.cancel()
            timer.join()
            self._failed = f"user arm {self.spec}: {self._lost(expired.is_set(), late, gone, exc)}"
            raise UserArmError(self._failed) from None
        except BaseException:  # the stage's own interruption (Ctrl-C): the worker goes with it
            _kill(self._proc)
            self._failed = f"user arm {self.spec}: interrupted; its process was killed"
            raise
        finally:
            timer.cancel()
        timer.join()
        if expired.is_set():  # the answer came as the limit ran out: too late, and the worker is killed
            self._failed = f"user arm {self.spec}: {late}; its process was killed"
            raise UserArmError(self._failed)
        return result

    def _lost(self, expired: bool, late: str, gone: str, exc: BaseException) -> str:
        """Why the worker did not answer: the limit, its own end, or a broken answer (then it is killed)."""
        if expired:
            self._proc.wait()
            return f"{late}; its process was killed"
        try:
            return f"its process ended ({_status(self._proc.wait(timeout=5))}) {gone}"
        except subprocess.TimeoutExpired:  # alive, but its answer broke off: not an answer
            _kill(self._proc)
            self._proc.wait()
            return f"its answer broke off ({exc}) {gone}; its process was killed"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the worker's process group (the worker and anything it started), unless already reaped."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _stop(proc: subprocess.Popen[bytes], conn: Connection) -> None:
    conn.close()
    _kill(proc)
    proc.wait()


# --- the worker's side (``python -m int8alibi.kernels FD PARENT_PID``) ---


def _die_with(parent: int) -> None:
    """Have the kernel kill this worker when the stage's process ends, however it ends (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the stage ended before the request took effect
        os._exit(1)


def _run(fn: Callable[..., object], operands: tuple[torch.Tensor, ...]) -> torch.Tensor | str:
    """``fn(*copies)``: its result when it is one the stage can use, else the reason it is not."""
    copies = tuple(t.clone() for t in operands)
    try:
        out = fn(*copies)
    except SystemExit as exc:
        return f"called SystemExit({exc.code!r}) instead of returning a result"
    except BaseException as exc:  # the user's code: anything it raises, KeyboardInterrupt included, is named
        return f"raised {describe(exc)}"[:_REASON_CHARS]
    changed = [label for label, a, b in zip(_LABELS, operands, copies) if not (a.device == b.device and bits_equal(a, b))]
    if changed:
        return (f"wrote into its input operand(s) {', '.join(changed)}; an arm must leave its inputs as it got them "
                "(its result is not used)")
    m, n = operands[0].shape[0], operands[1].shape[0]
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n):
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        return f"returned {got}, expected torch.bfloat16 [{m}, {n}]"
    if out.device != operands[0].device:
        return f"returned a tensor on {out.device}, operands on {operands[0].device}"
    return out


def _source(fn: object) -> str:
    """The file the function was defined in, for the arm's evidence."""
    try:
        return inspect.getsourcefile(fn) or "unknown"  # type: ignore[arg-type]
    except Exception:  # a builtin, or a callable object of the user's that will not say
        return "unknown"


def serve(load: Callable[[str], Callable[..., object]], argv: list[str]) -> int:
    """The worker: import the arm named by the stage (``load``), then answer calls until the stage
    closes the socket."""
    _die_with(int(argv[1]))
    conn = Connection(int(argv[0]))
    hello = _receive(conn)
    sys.path[:] = hello["path"]
    for name, value in hello["torch"].items():
        get, put = TORCH_SETTINGS[name]
        if get() != value:  # some setters cost seconds even when nothing changes
            put(value)
    _send(conn, {"started": os.getpid()})
    try:
        fn = load(hello["spec"])
    except InputError as exc:
        _send(conn, {"error": str(exc)[:_REASON_CHARS]})
        return 0
    _send(conn, {"source": _source(fn)})
    while True:
        try:
            request = _receive(conn)
        except _Gone:  # the stage closed its end: the arm is no longer needed
            return 0
        device = torch.device(request["device"])
        operands = tuple(_receive_into(conn, torch.empty(shape, dtype=_DTYPES[dtype])).to(device)
                         for dtype, shape in request["operands"])
        out = _run(fn, operands)
        if isinstance(out, str):
            _send(conn, {"error": out})
        else:
            _send(conn, {"result": True})
            conn.send_bytes(_raw(out))
