"""The sandbox a submission's kernel runs in: bubblewrap, limits, and what it can see.

Each notebook gets its own ``bwrap`` process (Debian package ``bubblewrap``)::

    prlimit --as=MEM --nproc=N --fsize=F --nofile=K -- \\
    bwrap --unshare-all --die-with-parent --new-session --uid 65534 --gid 65534 \\
          --ro-bind /usr /usr  (+ /bin /lib /lib64 /sbin as symlinks into it)
          --ro-bind <site>/flashlab /opt/flashlab/flashlab  the package, without the grader
          --ro-bind <repo>/results /opt/flashlab/results   recorded measurements (public)
          --ro-bind a few files of /etc (loader cache, fonts, users)
          --dev /dev --proc /proc                          its own /proc: only its processes
          --tmpfs /tmp --tmpfs /home/student --tmpfs /run/kernel   (size-capped, in memory)
          --ro-bind <python> --ro-bind <venv>   the interpreter and its packages (after /tmp:
                                                a venv under /tmp stays visible)
          --ro-bind <notebook> /home/student/<chapter>.ipynb
          python -m ipykernel_launcher -f /run/kernel/connection.json

so the kernel runs as ``nobody`` with no network, no view of the repository (its
notebooks, book, tests), of the instructor's notebooks, of other submissions or of
the grader's files; everything it can write is a size-capped ``tmpfs`` that vanishes
with the sandbox. ``--unshare-pid`` gives it a process namespace of its own: it cannot
name, let alone signal, a process outside, and every process it starts (a detached
daemon included) dies when the sandbox does. The grader reaches the kernel's ZeroMQ
sockets (IPC transport) through ``/proc/<pid>/root/run/kernel`` from outside.

The package is a copy (:func:`package_copy`) of ``flashlab`` without
``flashlab/course/grader`` and the course's build tools, because the installed one is
an editable install that points into the repository.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # flashlab/
REPO_ROOT = PACKAGE_DIR.parent
#: Where the package copy and the recorded results appear inside the sandbox.
SITE = "/opt/flashlab"
HOME = "/home/student"
RUN = "/run/kernel"
UID = GID = 65534  # nobody / nogroup
#: Files of the package left out of the sandbox: the grader, the course's build tools.
EXCLUDED = ("course/grader", "course/assignments.py", "course/site.py", "course/run_notebooks.py",
            "course/claims.py")
#: /etc files the kernel may read (dynamic loader, users for getpass, fonts for matplotlib).
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "localtime",
       "fonts", "mime.types")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create its namespaces here."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox (setrlimit through ``prlimit``, tmpfs sizes).

    Attributes
    ----------
    memory_bytes : int
        RLIMIT_AS of every process in the sandbox (address space, bytes).
    processes : int
        RLIMIT_NPROC: processes and threads (a fork bomb stops here).
    file_bytes : int
        RLIMIT_FSIZE: the largest file a process may write.
    open_files : int
        RLIMIT_NOFILE.
    tmpfs_bytes : int
        Size of each writable folder (``/home/student``, ``/tmp``).
    """

    memory_bytes: int = 8 << 30
    processes: int = 512
    file_bytes: int = 64 << 20
    open_files: int = 1024
    tmpfs_bytes: int = 256 << 20


def bwrap_path() -> str | None:
    """The ``bwrap`` executable on PATH, or None."""
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why sandboxes cannot run here, or None when a trial ``bwrap`` works."""
    bwrap = bwrap_path()
    if bwrap is None:
        return ("bubblewrap (bwrap) is not installed: install the Debian package `bubblewrap` "
                "(`make bubblewrap`, or `apt-get install bubblewrap`)")
    probe = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--uid", str(UID), "--gid", str(GID),
             "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "true"]
    try:
        run = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap failed to start: {exc}"
    if run.returncode != 0:
        return (f"bubblewrap cannot create its namespaces here (exit {run.returncode}: "
                f"{run.stderr.strip()[:300]}); user namespaces may be disabled")
    return None


def require(unsafe_no_sandbox: bool) -> bool:
    """Whether kernels run in sandboxes: False when the caller passed ``unsafe_no_sandbox``,
    True when bubblewrap works here; otherwise raise :class:`SandboxUnavailable`."""
    if unsafe_no_sandbox:
        return False
    reason = unavailable_reason()
    if reason is None:
        return True
    raise SandboxUnavailable(
        f"refusing to grade: {reason}. Submissions are untrusted programs; without the sandbox a "
        "submission can read the answer key and change other students' grades. To grade anyway, on a "
        "machine you can throw away, pass --unsafe-no-sandbox.")


def package_copy(into: Path, held: Iterable[str] = ()) -> Path:
    """Copy the ``flashlab`` package without the grader into ``into/flashlab``; return ``into``.

    The functions named in ``held`` ("module:qualname") are left out of the copy: their
    bodies ask the grader to run them (:func:`.served.hold`).
    """
    from . import served

    target = into / "flashlab"
    skip = {PACKAGE_DIR / rel for rel in EXCLUDED}

    def ignore(folder: str, names: list[str]) -> list[str]:
        here = Path(folder)
        return [n for n in names if n == "__pycache__" or here / n in skip or n.endswith(".pyc")]

    shutil.copytree(PACKAGE_DIR, target, ignore=ignore)
    served.hold(target, held)
    served.leave_out_kernels(target)
    return into


def _etc_binds() -> list[str]:
    args: list[str] = []
    for name in ETC:
        path = Path("/etc") / name
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    return args


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def _python_binds() -> list[str]:
    """The interpreter's installation and the virtual environment, read-only."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    exe = Path(sys.executable)
    roots.add(exe.resolve().parent.parent)
    args: list[str] = []
    for root in sorted(roots):
        if not str(root).startswith("/usr"):
            args += ["--ro-bind", str(root), str(root)]
    venv = Path(sys.prefix)
    if venv != venv.resolve():
        args += ["--ro-bind", str(venv), str(venv)]
    return args


@dataclass
class Launch:
    """A started sandbox: its ``bwrap`` process and the pid (outside) of the process inside."""

    process: subprocess.Popen
    inner_pid: int | None
    sandboxed: bool


def kernel_env(triton_interpret: bool, sandboxed: bool) -> dict[str, str]:
    """The environment of the kernel: nothing of the grader's but what Python needs."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": HOME if sandboxed else os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/matplotlib" if sandboxed else tempfile.gettempdir(),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "JPY_SESSION_NAME": "",
    }
    if triton_interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def start(workdir: Path, notebook: Path | None, connection: dict, *, site: Path | None, limits: Limits,
          triton_interpret: bool, sandboxed: bool) -> Launch:
    """Start ``python -m ipykernel_launcher`` for one notebook, in a sandbox when ``sandboxed``.

    ``workdir`` is the grader's private folder for this notebook (never shown to the
    kernel); ``connection`` the kernel's connection info, with IPC paths under
    :data:`RUN` (sandboxed) or under ``workdir`` (unsafe mode).
    """
    conn_file = workdir / "connection.json"
    conn_file.write_text(json.dumps(connection))
    env = kernel_env(triton_interpret, sandboxed)
    kernel = [sys.executable, "-m", "ipykernel_launcher", "-f"]
    if not sandboxed:
        env["PYTHONPATH"] = str(site) if site else ""
        home = workdir / "home"
        home.mkdir(exist_ok=True)
        if notebook is not None:
            shutil.copy(notebook, home / notebook.name)
        proc = subprocess.Popen([*kernel, str(conn_file)], cwd=home, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        return Launch(proc, None, False)
    env["PYTHONPATH"] = SITE
    read, write = os.pipe()
    size = str(limits.tmpfs_bytes)
    cmd = [
        "prlimit", f"--as={limits.memory_bytes}", f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}", "--core=0", "--",
        bwrap_path() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
        "--uid", str(UID), "--gid", str(GID), "--hostname", "sandbox",
        *_system_binds(), *_etc_binds(),
        "--dev", "/dev", "--proc", "/proc",
        "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
        "--size", size, "--tmpfs", "/tmp",
        "--size", size, "--tmpfs", HOME,
        "--size", str(1 << 20), "--perms", "0700", "--tmpfs", RUN,
        # after the tmpfs mounts, which would otherwise hide a venv that lives under /tmp
        *_python_binds(),
        "--ro-bind", str(conn_file), f"{RUN}/connection.json",
    ]
    if site is not None:
        cmd += ["--ro-bind", str(site / "flashlab"), f"{SITE}/flashlab"]
        results = REPO_ROOT / "results"
        if results.is_dir():
            cmd += ["--ro-bind", str(results), f"{SITE}/results"]
    if notebook is not None:
        cmd += ["--ro-bind", str(notebook), f"{HOME}/{notebook.name}"]
    # the sandbox's own root (an in-memory tmpfs holding the mount points) becomes read-only:
    # only /tmp and /home/student, size-capped, can be written
    cmd += ["--remount-ro", "/", "--chdir", HOME, "--info-fd", str(write), "--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    cmd += [*kernel, f"{RUN}/connection.json"]
    log = (workdir / "bwrap.log").open("wb")  # bwrap's errors; the kernel's own stderr lands here too
    try:
        proc = subprocess.Popen(cmd, pass_fds=(write,), env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    finally:
        os.close(write)
        log.close()
    info = b""
    with os.fdopen(read, "rb") as pipe:
        while b"}" not in info:
            chunk = pipe.read1(4096)
            if not chunk:
                break
            info += chunk
    try:
        inner = int(json.loads(info.decode())["child-pid"])
    except (ValueError, KeyError):
        proc.kill()
        proc.wait(timeout=10)
        err = (workdir / "bwrap.log").read_text(errors="replace").strip()
        raise SandboxUnavailable(f"bubblewrap did not start the kernel: {err[:500]}") from None
    return Launch(proc, inner, True)


def connection_info(workdir: Path, sandboxed: bool) -> tuple[dict, dict]:
    """(what the kernel reads, what the grader connects with): IPC transport, a fresh key."""
    key = secrets.token_hex(32)
    inside = {"transport": "ipc", "ip": f"{RUN}/k" if sandboxed else str(workdir / "k"),
              "shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5,
              "key": key, "signature_scheme": "hmac-sha256", "kernel_name": "python3"}
    return inside, dict(inside)
