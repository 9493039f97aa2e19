"""``python -m int8alibi.kernels FD PARENT_PID``: the worker process of one user arm, started by
``user_guard.UserProcess`` (not a command to run by hand)."""

import sys

from .registry import serve_user_arm

raise SystemExit(serve_user_arm(sys.argv[1:]))
