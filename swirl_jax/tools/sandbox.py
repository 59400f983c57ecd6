"""Python sandbox for model-written code (the SimpleTIR tool).

Each snippet runs in its own process tree, in the strongest isolation the
host allows (`Sandbox.isolation` says which):

- 'bubblewrap': `bwrap` with new network, PID, IPC and UTS namespaces; a
  read-only view of /usr, the libraries and the Python installation only
  (no /etc, /home, /root beyond the interpreter, no project files); a
  private size-capped tmpfs as working directory; an empty environment
  plus PATH, HOME=/tmp and PYTHONHASHSEED. As root, bwrap sets the mounts
  up with only CAP_SETUID/CAP_SETGID kept, and the snippet then drops to an
  unprivileged uid, one per concurrent slot so that one snippet's fork bomb
  cannot use up another's process budget. As a normal user, bwrap's user
  namespace keeps the caller's own uid.
- 'rlimits+namespaces': `unshare` network/PID/IPC/UTS namespaces, rlimits;
  the host filesystem stays visible and writable by the snippet's uid.
- 'rlimits': resource limits only; a snippet can signal other processes
  of its uid.
Both fallbacks, as root, drop to an unprivileged uid and are unavailable
when the interpreter cannot be reached by one; as a normal user they run
as that user, so they only suit trusted code.

In every mode a small bootstrap sets hard rlimits (CPU seconds, address
space, processes, file size, open files, no core dumps) before the snippet
runs, and the parent kills the whole process tree at the wall-clock limit
(killing bwrap ends its PID namespace, and every process in it). The wall
clock starts when the snippet does, so sandbox start-up on a loaded host
is not charged to it. Output
goes to files whose size the file-size limit caps, so a flood of output
cannot grow the parent's memory.

`final_answer(x)` (prints `\\boxed{x}`) is predefined in every snippet's
namespace rather than prepended as source, so error line numbers match the
model's code. The result keeps stdout cut to 512 characters (head and
tail, as SimpleTIR does) and the last stderr line; `format_observation`
writes SimpleTIR's `Code execution result: ...` text.
"""

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import queue
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile

ISOLATIONS = ("bubblewrap", "rlimits+namespaces", "rlimits")
# Below one pipe buffer (64 KiB), so sending the code never blocks.
_MAX_CODE_BYTES = 60_000
_TRUNCATION_NOTE = ("\n..._This content has been truncated to stay below "
                    "{n} characters_...\n")
_SIGNALS = {  # SIGXCPU (the CPU-seconds limit) is a timeout: `_run`.
    signal.SIGKILL: "Killed (resource limit exceeded)",
    signal.SIGSEGV: "Segmentation fault",
    signal.SIGXFSZ: "OSError: output or file size limit exceeded",
    signal.SIGABRT: "Aborted",
    signal.SIGBUS: "Bus error",
}

# Runs inside the sandbox: limits, privilege drop, then the snippet.
_BOOTSTRAP = r"""
import json, os, resource, sys
_cfg = json.loads(sys.argv[1])
sys.path.extend(_cfg["path"])  # Started with -S: no .pth files run.
_code = sys.stdin.read()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
for _name, (_soft, _hard) in _cfg["limits"].items():
  resource.setrlimit(getattr(resource, _name), (_soft, _hard))
if _cfg["uid"] is not None:
  os.setgroups([])
  os.setresgid(_cfg["uid"], _cfg["uid"], _cfg["uid"])
  os.setresuid(_cfg["uid"], _cfg["uid"], _cfg["uid"])
def final_answer(result):
  print(f"\\boxed{{{result}}}")
_globals = {"__name__": "__main__", "__builtins__": __builtins__,
            "final_answer": final_answer}
os.write(_cfg["ready_fd"], b"1")  # The parent's wall clock starts now.
os.close(_cfg["ready_fd"])
del json, os, resource, sys, _name, _soft, _hard, _cfg
exec(compile(_code, "<code>", "exec"), _globals)
"""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  stdout: str             # Cut to max_output_chars, head and tail kept.
  stderr_last_line: str   # Last non-empty stderr line, or what killed it.
  ok: bool                # Exit status 0 within the time limit.
  timed_out: bool
  exit_code: int | None
  isolation: str


def truncate(text: str, max_chars: int = 512) -> str:
  """SimpleTIR's cut: first and last half of the budget, with a note."""
  if len(text) <= max_chars:
    return text
  half = max_chars // 2
  return text[:half] + _TRUNCATION_NOTE.format(n=max_chars) + text[-half:]


def format_observation(result: SandboxResult) -> str:
  """SimpleTIR's observation: stdout, or the error line if the code failed.

  Unlike SimpleTIR, stderr from a successful run (warnings) does not hide
  stdout, and a run that printed nothing still yields an observation.
  """
  body = result.stdout if result.ok else (result.stderr_last_line or "Error")
  return f"\nCode execution result: {body}\n"


def _python_dirs():
  """Directories the interpreter and its packages live in, outermost."""
  dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
          os.path.dirname(os.path.realpath(sys.executable))}
  dirs.update(site.getsitepackages())
  real = sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})
  out = []
  for d in real:
    if d.startswith("/usr/") or d == "/usr":
      continue
    if not any(d == o or d.startswith(o + os.sep) for o in out):
      out.append(d)
  return out


def _world_readable(path):
  """Whether an unprivileged uid can reach `path` (o+x on every parent)."""
  p = pathlib.Path(path)
  return all(os.stat(a).st_mode & 0o001 for a in [p, *p.parents])


def _bwrap_args(bwrap, tmpfs_bytes, as_root):
  args = [bwrap, "--unshare-net", "--unshare-pid", "--unshare-ipc",
          "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
          "--die-with-parent", "--new-session", "--clearenv"]
  if as_root:
    args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
             "--cap-add", "CAP_SETGID"]
  else:
    args += ["--unshare-user"]
  args += ["--ro-bind", "/usr", "/usr"]
  for d in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
    if os.path.islink(d):
      args += ["--symlink", os.readlink(d), d]
    elif os.path.isdir(d):
      args += ["--ro-bind", d, d]
  for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime"):
    args += ["--ro-bind-try", f, f]
  made = {"/", "/usr", "/tmp", "/proc", "/dev"}
  for d in _python_dirs():
    # Parents are made world-traversable: the snippet's uid must reach the
    # interpreter even when it sits under a private home directory.
    for parent in reversed(pathlib.Path(d).parents):
      if str(parent) not in made:
        made.add(str(parent))
        args += ["--perms", "0755", "--dir", str(parent)]
    args += ["--ro-bind", d, d]
  args += ["--proc", "/proc", "--dev", "/dev",
           "--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/tmp",
           "--chdir", "/tmp"]
  for key, value in _ENV.items():
    args += ["--setenv", key, value]
  return args + ["--"]


_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
        "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8", "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1"}


def _read_ends(f, n):
  """First and last n bytes of an open file, decoded (middle dropped)."""
  size = f.seek(0, os.SEEK_END)
  f.seek(0)
  if size <= 2 * n:
    data = f.read()
  else:
    head = f.read(n)
    f.seek(size - n)
    data = head + b"\n...\n" + f.read(n)
  return data.decode("utf-8", errors="replace")


class Sandbox:
  """Runs Python snippets in isolated, resource-limited processes.

  Args:
    timeout_s: wall-clock limit per snippet (SimpleTIR: 3 s).
    memory_bytes: address-space limit (SimpleTIR: 512 MB).
    cpu_s: CPU-seconds limit; defaults to the wall-clock limit, rounded up.
      Reaching it is a timeout, as the wall clock's is (`timed_out`, one
      message).
    max_processes: processes and threads the snippet's uid may hold.
    max_file_bytes: largest file (and stdout/stderr) it may write.
    max_open_files: file descriptors.
    tmpfs_bytes: size of its private working directory (bubblewrap).
    max_output_chars: stdout kept in the result (SimpleTIR: 512).
    max_concurrency: snippets run at once by `run_batch`.
    isolation: 'auto' (strongest that works) or one of ISOLATIONS; asking
      for 'bubblewrap' raises if it does not work here.
    uid_base: root only: snippets run as uid_base + slot, one uid per
      concurrent slot.
    startup_timeout_s: time allowed for the sandbox to start the snippet
      (not counted in timeout_s).
    cpus: CPU numbers the snippets run on (`taskset`); () for any. Keeps
      snippets off the cores that feed the accelerator (or, on a CPU-only
      host, off those that decode).
  """

  def __init__(self, timeout_s: float = 3.0, memory_bytes: int = 512 << 20,
               cpu_s: int | None = None, max_processes: int = 64,
               max_file_bytes: int = 8 << 20, max_open_files: int = 256,
               tmpfs_bytes: int = 64 << 20, max_output_chars: int = 512,
               max_concurrency: int = 64, isolation: str = "auto",
               uid_base: int = 60000, startup_timeout_s: float = 60.0,
               cpus: tuple[int, ...] = ()):
    if isolation != "auto" and isolation not in ISOLATIONS:
      raise ValueError(f"isolation={isolation!r}: expected 'auto' or one of "
                       f"{ISOLATIONS}")
    self.timeout_s = timeout_s
    self.max_output_chars = max_output_chars
    self.max_concurrency = max_concurrency
    self.startup_timeout_s = startup_timeout_s
    self._pin = []
    if cpus:
      if not shutil.which("taskset"):
        raise RuntimeError("Sandbox(cpus=...) needs taskset (util-linux)")
      self._pin = [shutil.which("taskset"), "-c",
                   ",".join(str(int(c)) for c in cpus)]
    cpu_s = cpu_s or max(1, int(-(-timeout_s // 1)))
    self._limits = {
        "RLIMIT_CPU": (cpu_s, cpu_s + 1),  # SIGXCPU first, SIGKILL after.
        "RLIMIT_AS": (memory_bytes, memory_bytes),
        "RLIMIT_NPROC": (max_processes, max_processes),
        "RLIMIT_FSIZE": (max_file_bytes, max_file_bytes),
        "RLIMIT_NOFILE": (max_open_files, max_open_files),
        "RLIMIT_CORE": (0, 0),
    }
    self._tmpfs_bytes = tmpfs_bytes
    self._as_root = os.geteuid() == 0
    self._uids = queue.Queue()
    for slot in range(max_concurrency):
      self._uids.put(uid_base + slot)
    self.isolation = self._choose(isolation)

  # ------------------------------------------------------------ public.

  def run(self, code: str) -> SandboxResult:
    """Runs one snippet; never raises for anything the snippet does."""
    code = str(code).encode("utf-8", errors="replace")
    if len(code) > _MAX_CODE_BYTES:
      return SandboxResult("", f"SandboxError: code longer than "
                           f"{_MAX_CODE_BYTES} bytes", False, False, None,
                           self.isolation)
    uid = self._uids.get()
    try:
      return self._run(code, uid)
    finally:
      self._uids.put(uid)

  def run_batch(self, snippets) -> list[SandboxResult]:
    """Runs snippets concurrently (at most max_concurrency), in order."""
    snippets = list(snippets)
    if not snippets:
      return []
    workers = min(self.max_concurrency, len(snippets))
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
      return list(ex.map(self.run, snippets))

  # --------------------------------------------------------- internals.

  def _choose(self, wanted):
    candidates = ISOLATIONS if wanted == "auto" else (wanted,)
    errors = []
    for mode in candidates:
      if mode == "bubblewrap" and not shutil.which("bwrap"):
        errors.append("bubblewrap: bwrap not found on PATH")
        continue
      if mode == "rlimits+namespaces" and not shutil.which("unshare"):
        errors.append("rlimits+namespaces: unshare not found on PATH")
        continue
      if (mode != "bubblewrap" and self._as_root
          and not all(_world_readable(d) for d in _python_dirs())):
        # Root code on the host's own filesystem is no sandbox at all.
        errors.append(f"{mode}: running as root, and the interpreter is not "
                      "reachable by an unprivileged uid")
        continue
      self.isolation = mode
      probe = self._run(b"print(6 * 7)", self._uids.queue[0])
      if probe.ok and probe.stdout.strip() == "42":
        return mode
      errors.append(f"{mode}: {probe.stderr_last_line or probe.exit_code}")
    raise RuntimeError("no sandbox isolation works here: " + "; ".join(errors))

  def _command(self, uid, ready_fd):
    # Only root switches uid; a normal user already is unprivileged.
    cfg = json.dumps({"limits": self._limits,
                      "uid": uid if self._as_root else None,
                      "ready_fd": ready_fd, "path": site.getsitepackages()})
    # -S: the site module's start-up (every .pth file in site-packages,
    # an editable install's hooks among them) would take about half of a
    # snippet's start; the bootstrap puts site-packages on the path itself.
    python = [os.path.realpath(sys.executable), "-S", "-u", "-c",
              _BOOTSTRAP, cfg]
    if self.isolation == "bubblewrap":
      return self._pin + _bwrap_args(shutil.which("bwrap"),
                                     self._tmpfs_bytes, self._as_root) + python
    if self.isolation == "rlimits+namespaces":
      ns = [shutil.which("unshare"), "--fork", "--pid", "--kill-child",
            "--net", "--ipc", "--uts"]
      if not self._as_root:
        ns[1:1] = ["--user", "--map-root-user"]
      return self._pin + ns + ["--"] + python
    return self._pin + python

  def _run(self, code, uid):
    workdir = None
    if self.isolation != "bubblewrap":
      workdir = tempfile.mkdtemp(prefix="sandbox_")
      os.chmod(workdir, 0o777)
    try:
      with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        exit_code, timed_out = self._spawn(code, uid, out, err, workdir)
        # The CPU-seconds limit backs the wall clock up: which of the two
        # ends a loop first depends on the host's load (CPU time counts
        # the interpreter's start, the wall clock does not), so both are
        # the one time limit, with one answer.
        timed_out = timed_out or _signal(exit_code) == signal.SIGXCPU
        if self.isolation == "rlimits" and self._as_root:
          _kill_uid(uid)  # No PID namespace: sweep escaped descendants.
        stdout = _read_ends(out, 4 * self.max_output_chars)
        stderr = _read_ends(err, 4096)
    except OSError as e:  # Could not even start (fd or process limits).
      return SandboxResult("", f"SandboxError: {e}", False, False, None,
                           self.isolation)
    finally:
      if workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return SandboxResult(
        stdout=truncate(stdout, self.max_output_chars),
        stderr_last_line=self._error_line(stderr, exit_code, timed_out),
        ok=exit_code == 0 and not timed_out, timed_out=timed_out,
        exit_code=exit_code, isolation=self.isolation)

  def _spawn(self, code, uid, out, err, workdir):
    """Starts the snippet; returns (exit code, timed out).

    The wall clock starts when the bootstrap reports, through a pipe, that
    the snippet itself begins: sandbox start-up under load is not the
    snippet's time.
    """
    ready_r, ready_w = os.pipe()
    try:
      proc = subprocess.Popen(
          self._command(uid, ready_w), stdin=subprocess.PIPE, stdout=out,
          stderr=err, cwd=workdir,
          env={} if self.isolation == "bubblewrap" else dict(_ENV),
          pass_fds=(ready_w,), start_new_session=True)
    finally:
      os.close(ready_w)
    try:
      try:  # At most one pipe buffer: this write never blocks.
        proc.stdin.write(code)
        proc.stdin.close()
      except BrokenPipeError:
        pass
      poller = select.poll()  # Not select(): fds may exceed 1024 here.
      poller.register(ready_r, select.POLLIN)
      ready = poller.poll(self.startup_timeout_s * 1000)
      if ready:  # b"1" as the snippet starts; b"" if the sandbox died first.
        os.read(ready_r, 1)
      proc.wait(timeout=self.timeout_s if ready else 0)
      return proc.returncode, False
    except subprocess.TimeoutExpired:
      _kill_group(proc)
      return proc.returncode, True
    except BaseException:
      _kill_group(proc)
      raise
    finally:
      os.close(ready_r)

  def _error_line(self, stderr, exit_code, timed_out):
    if timed_out:
      return f"TimeoutError: execution exceeded {self.timeout_s:g} s"
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    if lines:
      return lines[-1]
    if exit_code:
      sig = _signal(exit_code)
      if sig in _SIGNALS:
        return _SIGNALS[sig]
      if sig > 0:
        return f"Killed by signal {sig}"
      return f"Exited with status {exit_code}"
    return ""


def _signal(exit_code):
  """The signal that ended a process of this exit code (bwrap reports a
  signal death as 128 + signal), else 0 or less."""
  if not exit_code:
    return 0
  return -exit_code if exit_code < 0 else exit_code - 128


def _kill_group(proc):
  """Kills the process group (bwrap / unshare and, with them, the PID
  namespace), then reaps."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  try:
    proc.wait(timeout=10)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


def _kill_uid(uid):
  """Kills every process whose real uid is `uid` (a sandbox-only uid)."""
  for entry in pathlib.Path("/proc").iterdir():
    if not entry.name.isdigit():
      continue
    try:
      status = (entry / "status").read_text()
    except OSError:
      continue
    for line in status.splitlines():
      if line.startswith("Uid:"):
        if int(line.split()[1]) == uid:
          try:
            os.kill(int(entry.name), signal.SIGKILL)
          except OSError:
            pass
        break
