"""A real one-node SLURM cluster for the tests, from the distribution's packages (Debian: slurm-wlm, munge).

``SlurmCluster(folder).start()`` writes a ``slurm.conf`` for one node (this host, its real CPU count and
memory as ``slurmd -C`` reads them), creates a munge key, starts ``munged``, ``slurmctld`` and ``slurmd`` (each
in the foreground as a child of this process, all state, spool and logs under ``folder``), and waits until
``sinfo`` shows the node idle; ``stop()`` ends the three daemons (no process is left). Client commands
(``sbatch``, ``squeue``, ``scancel``) find the cluster through ``env()`` (``SLURM_CONF``).

No cgroups and no systemd are needed: ``proctrack/linuxproc`` (a job's processes are found by their parent
process), ``task/none``, no accounting database (``squeue`` shows finished jobs for ``MinJobAge`` seconds and
``jobcomp/filetxt`` writes one line per finished job to ``jobcomp.log``: the cluster's history). The ports are
free ones picked at start, so two clusters on one machine do not meet.

``python tests/slurm_cluster.py DIR`` starts one and keeps it up until Ctrl-C (for trying ``posbench sweep
--executor slurm`` by hand: ``export SLURM_CONF=DIR/slurm.conf``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "srun")


def missing_programs() -> list[str]:
    """The programs a cluster needs that are not on PATH (or in /usr/sbin)."""
    return [name for name in (*DAEMONS, *CLIENTS) if which(name) is None]


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def install_packages() -> str | None:
    """``apt-get install slurm-wlm munge`` when the programs are missing and this is a root Debian machine;
    None when they are there, else the reason they are not."""
    if not missing_programs():
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"no {', '.join(missing_programs())} and no way to install them (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return f"'{' '.join(command)}' failed: {last[0]}"
    return None if not missing_programs() else f"still missing after install: {', '.join(missing_programs())}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_line() -> tuple[str, str]:
    """This host as ``slurmd -C`` reads it: (its node name, the ``NodeName=...`` line's hardware part)."""
    text = subprocess.run([which("slurmd"), "-C"], capture_output=True, text=True, check=True, timeout=60).stdout
    first = text.splitlines()[0].split()
    name = first[0].split("=", 1)[1]
    return name, " ".join(first[1:])


SLURM_CONF = """\
ClusterName=posbench-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket},cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
PlugStackConfig={root}/plugstack.conf
NodeName={node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """One node: this machine. ``start()``, then ``env()`` for the clients, ``stop()`` at the end."""

    def __init__(self, folder: Path | str):
        self.root = Path(folder).resolve()
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket.2"
        self.processes: dict[str, subprocess.Popen] = {}
        self.node = ""

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        (self.root / "plugstack.conf").write_text("")
        self.node, hardware = node_line()
        self.conf.write_text(SLURM_CONF.format(node=self.node, hardware=hardware, root=self.root,
                                               socket=self.socket, ctld_port=free_port(), d_port=free_port()))
        try:
            self._spawn("munged", [which("munged"), "--foreground", "--force", f"--socket={self.socket}",
                                   f"--key-file={key}", f"--log-file={self.root / 'munge' / 'munged.log'}",
                                   f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                                   f"--seed-file={self.root / 'munge' / 'munged.seed'}"])
            self._wait(lambda: self.socket.exists(), timeout, "munged's socket")
            self._spawn("slurmctld", [which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", [which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
            self._wait(self._node_idle, timeout, f"node {self.node} idle in sinfo")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "ab")
        self.processes[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _node_idle(self) -> bool:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.root / f"{name}.out").read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"{name} exited with {process.returncode}: {' | '.join(tail)}")
        return self._idle()

    def _idle(self) -> bool:
        """The node is idle: no job and no job step still running or completing on it."""
        done = self.run("sinfo", "-h", "-N", "-o", "%t", check=False)
        return done.returncode == 0 and done.stdout.strip() == "idle"

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test SLURM cluster did not come up: no {what} after {timeout:.0f} s "
                                   f"(logs in {self.root})")
            time.sleep(0.2)

    def run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([which(program), *args], capture_output=True, text=True, env=self.env(),
                              check=check, timeout=60)

    def stop(self) -> None:
        """Cancel the jobs still queued or running and wait (up to 30 s) until the node is idle again, so that no
        job process outlives the cluster; then SIGTERM to the daemons (slurmd first), SIGKILL to any still there
        after 10 s; waits for each."""
        if all(self.processes.get(name) is not None and self.processes[name].poll() is None for name in DAEMONS):
            self.run("scancel", "--user", str(os.getuid()), check=False)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not self._idle():
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                process.terminate()
        for name, process in self.processes.items():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.processes.clear()

    def history(self) -> str:
        """Every finished job as ``jobcomp/filetxt`` recorded it (the accounting a cluster without a database has)."""
        path = self.root / "jobcomp.log"
        return path.read_text() if path.exists() else ""


if __name__ == "__main__":
    reason = install_packages()
    if reason:
        sys.exit(f"error: {reason}")
    import signal

    cluster = SlurmCluster(sys.argv[1] if len(sys.argv) > 1 else "slurm-test").start()
    print(f"SLURM is up: export SLURM_CONF={cluster.conf}  (Ctrl-C or SIGTERM stops it)", flush=True)

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        cluster.stop()
