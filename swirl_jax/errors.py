"""Errors a user can act on, and the one line each reads as.

`UserError` is the base of the package's own: a bad config value, a data,
checkpoint or tokenizer file that is missing or malformed, a judge that
cannot answer. `one_line` also knows the machine's faults (disk full,
read-only disk, a missing file), including those the checkpoint library
reports only inside its own error text. `main` prints that line instead of
a traceback.
"""

import errno
import os
import pathlib
import re


class UserError(Exception):
  """A fault of the input or of the machine, not of the program."""


# Faults of the disk rather than of the program.
_DISK = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
         errno.EROFS: "read-only file system", errno.EACCES: "not writable",
         errno.EPERM: "not writable"}
# Tensorstore (under orbax) puts the OS error in the text of a ValueError.
_OS_CODE = re.compile(r"os_error_code='(\d+)'")
_QUOTED_PATH = re.compile(r'"(/[^"]+)"')


def _chain(e: BaseException):
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    yield e
    e = e.__cause__ or e.__context__


def disk_error(e: BaseException) -> str | None:
  """'disk full: <path>: No space left on device' for a disk fault (in `e`
  or what caused it), else None."""
  for x in _chain(e):
    code = getattr(x, "errno", None)
    path = getattr(x, "filename", None)
    if code is None:
      m = _OS_CODE.search(str(x))
      code = int(m.group(1)) if m else None
      paths = _QUOTED_PATH.findall(str(x))
      path = paths[-1] if paths else None
    if code in _DISK:
      where = f"{path}: " if path else ""
      return f"{_DISK[code]}: {where}{os.strerror(code)}"
  return None


def one_line(e: BaseException) -> str | None:
  """The line a user reads for a known user error, else None (a bug)."""
  if isinstance(e, UserError):
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
  disk = disk_error(e)
  if disk:
    return disk
  if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
    return str(e)
  return None


def check_writable(workdir: str) -> None:
  """Creates `workdir` and writes a file there, or raises UserError."""
  if "://" in str(workdir):  # pathlib would make a local 'gs:/...' dir.
    raise UserError(
        f"workdir {workdir}: a URL; mount the bucket and pass the mount "
        "path (launch/tpu_vm.sh run --workdir=gs://... mounts it with "
        "gcsfuse on every host)")
  path = pathlib.Path(workdir)
  probe = path / ".write_test"
  try:
    path.mkdir(parents=True, exist_ok=True)
    with open(probe, "wb") as f:
      f.write(b"0")
      f.flush()
      os.fsync(f.fileno())
    probe.unlink()
  except OSError as e:
    raise UserError(f"workdir {workdir}: {e.strerror or e}") from e
