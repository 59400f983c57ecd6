"""Judge config blocks: defaults, validation, the judge one describes, and
its identity (what its labels depend on).

A block holds every field of every kind, so `--config.judge.kind=http` on
any config works by itself (plus `--config.judge.model_name=...`); only the
fields of the chosen kind are read.
"""

from typing import Any, Sequence

from swirl_jax import config_blocks, config_lib, distributed
from swirl_jax.judges import base
from swirl_jax.judges.http_judge import HTTPJudge, chat_url
from swirl_jax.judges.model import ModelJudge
from swirl_jax.judges.programmatic import ProgrammaticJudge
from swirl_jax.models import loading

# The blocks live with the other defaults, light for config files.
KINDS = config_blocks.JUDGE_KINDS
_FIELDS = config_blocks.JUDGE_FIELDS
_check_kind = config_blocks.check_judge_kind
default_config = config_blocks.judge_config

_HTTP_KW = ("api_key_env", "max_concurrency", "requests_per_second",
            "max_retries", "backoff_s", "max_backoff_s", "timeout_s",
            "logprobs", "top_logprobs", "max_tokens", "temperature",
            "max_unparsable", "retry_log_every_s")


def validate(config, name: str = "judge") -> None:
  """Raises a one-line ConfigError naming the first field `kind` lacks."""
  kind = config.get("kind")
  _check_kind(kind, name)
  for field in ("threshold", *_FIELDS[kind]()):
    if field not in config:
      raise config_lib.ConfigError(
          f"{name}.{field} is missing (a {kind!r} judge reads it); build "
          "the block with judges.default_config()")
  if kind == "http":
    for field in ("base_url", "model_name"):
      if not config[field]:
        raise config_lib.ConfigError(
            f"{name}.{field} is empty: an HTTP judge needs it "
            f"(--config.{name}.{field}=...)")


def make_judge(config, tasks: Sequence[Any] | None = None,
               model: tuple | None = None, *, default_cache_path: str = "",
               name: str = "judge") -> base.Judge:
  """The judge a config block describes (see `default_config`).

  Args:
    config: ConfigDict with `kind` and that kind's fields.
    tasks: the tasks being judged (required by 'programmatic').
    model: an already loaded (cfg, params, tokenizer) for 'model', e.g. the
      policy itself; else `config.model` is loaded.
    default_cache_path: the HTTP judge's disk cache when `cache_path` is ''.
    name: the block's name in the config, for error messages.
  """
  validate(config, name)
  c = config
  if c.kind == "model":
    cfg, params, tok = model if model is not None else \
        loading.load_policy(c.model, mesh=loading.host_mesh(c.model))
    return ModelJudge(params, cfg, tok, threshold=c.threshold,
                      batch_size=c.batch_size, max_len=c.max_len,
                      scoring=c.scoring)
  if c.kind == "http":
    cache = c.cache_path or default_cache_path
    return HTTPJudge(c.base_url, c.model_name, threshold=c.threshold,
                     # One SQLite writer per file: each host its own cache.
                     cache_path="" if cache in ("", "off") else
                     distributed.host_file(cache),
                     **{k: c[k] for k in _HTTP_KW})
  if tasks is None:
    raise ValueError(f"{name}: a programmatic judge needs the tasks")
  return ProgrammaticJudge(tasks, threshold=c.threshold)


def identity(config, policy_model=None) -> dict[str, Any]:
  """What the labels of the judge `config` describes depend on.

  Judges with equal identities label alike, so labels stored with one are
  reused only under an equal one. `policy_model` is the model config a
  'model' judge without a checkpoint of its own borrows (the policy's).
  """
  validate(config)
  c = config
  out = dict(kind=c.kind, threshold=float(c.threshold),
             prompt=base.PROMPT_VERSION)
  if c.kind == "model":
    m = policy_model if policy_model is not None else c.model
    out.update(model={k: m.get(k) for k in ("preset", "checkpoint",
                                            "tokenizer", "dtype",
                                            "param_dtype")},
               scoring=c.scoring, max_len=c.max_len)
  elif c.kind == "http":
    out.update(url=chat_url(c.base_url), model_name=c.model_name,
               logprobs=bool(c.logprobs), top_logprobs=c.top_logprobs,
               max_tokens=c.max_tokens, temperature=float(c.temperature))
  return out
