"""A real single-node SLURM cluster in a temporary state directory, for the cluster test.

Debian's packages (slurmctld, slurmd, slurm-client, munge) run without systemd and without
cgroups: munged, slurmctld and slurmd are started by hand with every path (key, socket, pid files,
spool, logs, the job-completion log) inside the state directory and ports chosen free, so two
clusters on one machine do not meet. The node declares one GPU (gres.conf: ``AutoDetect=off``,
``File=/dev/null``) so that a GPU request is accepted by the scheduler; nothing runs on a GPU.
There is no slurmdbd: ``sacct`` does not work, jobs are seen through ``squeue`` while they are
younger than ``MinJobAge`` and through the job-completion log (``jobcomp/filetxt``) afterwards.
Daemons are stopped by the pids in their pid files.

Clients find this cluster by ``SLURM_CONF`` (``env()``), not by the system's default path, so
nothing outside the state directory is written. One consequence needs a shim: inside a batch job
Snakemake's jobstep plugin starts the job step with ``srun`` after removing every ``SLURM_*``
variable but the job's identity, ``SLURM_CONF`` included; on a real cluster srun then reads the
default configuration. ``env()`` therefore puts ``<state>/bin`` first on ``PATH`` with an ``srun``
that sets ``SLURM_CONF`` to this cluster's file and runs the real one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
PROGRAMS = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel"]
# Declared to the scheduler (SlurmdParameters=config_overrides): a few more CPUs than the machine has,
# so independent jobs (the three fault shards) run side by side as they would on a real cluster, while
# the rest wait in SLURM's queue (twenty single-thread jobs at once on two cores spend more time on
# contention than on work: each job starts two Snakemake processes of its own); memory large enough
# for the rules' mem_mb requests (the scheduler counts cores only: CR_Core).
NODE_CPUS = 4
NODE_MEMORY_MB = 65536


def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if shutil.which(name) is None
            and not Path("/usr/sbin", name).exists()]


def can_install() -> str | None:
    """None when Debian's packages can be installed here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("apt-get") is None:
        return "no apt-get"
    return None


def install(timeout: int = 600) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    if subprocess.run(cmd, env=env, capture_output=True, timeout=timeout).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=timeout, check=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get install {' '.join(PACKAGES)} failed:\n{done.stderr[-2000:]}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SingleNodeSlurm:
    """munged + slurmctld + slurmd on this host, partitions ``cpu`` (default) and ``gpu``."""

    def __init__(self, state: Path, min_job_age: int = 600) -> None:
        self.state = state
        self.node = socket.gethostname().split(".")[0]
        self.etc = state / "etc"
        self.conf = self.etc / "slurm.conf"
        self.jobcomp = state / "jobcomp.txt"
        self.munge_socket = state / "munge" / "munge.socket.2"
        self.pid_files = {
            "slurmd": state / "run" / "slurmd.pid",
            "slurmctld": state / "run" / "slurmctld.pid",
            "munged": state / "munge" / "munged.pid",
        }
        self.min_job_age = min_job_age

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with what a client (sbatch, squeue,
        Snakemake's plugin, srun inside a job) needs to reach this cluster."""
        base = dict(os.environ if base is None else base)
        return {**base, "SLURM_CONF": str(self.conf), "PATH": f"{self.state / 'bin'}:{base.get('PATH', '')}"}

    def _write_config(self) -> None:
        s = self.state
        for sub in ["etc", "run", "log", "spool/ctld", "spool/d", "munge"]:
            (s / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(s / "munge", 0o755)
        (s / "bin").mkdir(exist_ok=True)
        srun = s / "bin" / "srun"
        srun.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {_program("srun")} "$@"\n')
        os.chmod(srun, 0o755)
        key = s / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.conf.write_text(f"""\
ClusterName=int8alibi-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={s}/spool/ctld
SlurmdSpoolDir={s}/spool/d
SlurmctldPidFile={self.pid_files['slurmctld']}
SlurmdPidFile={self.pid_files['slurmd']}
SlurmctldLogFile={s}/log/slurmctld.log
SlurmdLogFile={s}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
MinJobAge={self.min_job_age}
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes={self.node} MaxTime=INFINITE State=UP
""")
        (self.etc / "gres.conf").write_text(f"AutoDetect=off\nNodeName={self.node} Name=gpu File=/dev/null\n")

    def _run(self, *cmd: str) -> None:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, env=self.env())
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr}{self.logs()}")

    def start(self, timeout: float = 60) -> None:
        self._write_config()
        s = self.state
        self._run(_program("munged"), "--force", f"--socket={self.munge_socket}",
                  f"--key-file={s}/munge/munge.key", f"--pid-file={self.pid_files['munged']}",
                  f"--log-file={s}/munge/munged.log", f"--seed-file={s}/munge/munged.seed")
        self._run(_program("slurmctld"), "-c", "-f", str(self.conf))
        self._run(_program("slurmd"), "-f", str(self.conf))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                                  env=self.env())
            states = done.stdout.split()
            if done.returncode == 0 and states and all(
                    st.rstrip("*") in {"idle", "mixed", "allocated"} for st in states[1::2]):
                return
            time.sleep(1)
        raise RuntimeError(f"the node did not become idle within {timeout} s: {done.stdout}{done.stderr}{self.logs()}")

    def logs(self) -> str:
        out = []
        for name in ["log/slurmctld.log", "log/slurmd.log", "munge/munged.log"]:
            path = self.state / name
            if path.exists():
                out.append(f"\n--- {name} (tail)\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "".join(out)

    def running_pids(self) -> dict[str, int]:
        pids = {}
        for name, pid_file in self.pid_files.items():
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            pids[name] = pid
        return pids

    def stop(self, timeout: float = 20) -> list[str]:
        """SIGTERM each daemon by its pid file (slurmd, slurmctld, munged), SIGKILL what outlives
        ``timeout``; returns the daemons that had to be killed."""
        killed = []
        for name, pid in self.running_pids().items():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                os.kill(pid, signal.SIGKILL)
                killed.append(name)
        return killed

    def jobcomp_records(self) -> list[dict[str, str]]:
        """One dict per finished job from the job-completion log (``Key=Value`` fields)."""
        if not self.jobcomp.exists():
            return []
        records = []
        for line in self.jobcomp.read_text().splitlines():
            fields = {}
            for item in line.split():
                key, _, value = item.partition("=")
                fields[key] = value
            if "JobId" in fields:
                records.append(fields)
        return records
