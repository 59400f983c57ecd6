"""Hugging Face checkpoints: safetensors directory <-> swirl_jax params.

Loading places each parameter on the mesh as soon as it is assembled, one at
a time, so the host never holds the whole model and no device holds more
than its shard. Export writes a directory that `transformers` and vLLM load.
"""

import json
import os
import pathlib
import shutil
import tempfile
from typing import Callable, Iterator

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from swirl_jax import errors
from swirl_jax import distributed
from swirl_jax import sharding as shd
from swirl_jax.models import decoder
from swirl_jax.models.config import ModelConfig, from_hf_config, to_hf_config

Getter = Callable[[str], np.ndarray]


class CheckpointError(errors.UserError, ValueError):
  """A checkpoint file is missing, unreadable or does not fit the model."""


def _layer_norm_names(cfg: ModelConfig) -> dict[str, str]:
  names = {"input_norm": "input_layernorm",
           "post_attn_norm": "post_attention_layernorm"}
  if cfg.is_gemma:
    names.update(pre_ffw_norm="pre_feedforward_layernorm",
                 post_ffw_norm="post_feedforward_layernorm")
  return names


def _layer_tensors(cfg: ModelConfig) -> dict[tuple, tuple]:
  """Tree path -> (HF name template, to-tree fn, from-tree fn) per layer."""
  D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  a, m = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
  t = {
      ("attn", "q"): (a + "q_proj.weight", lambda w: w.T.reshape(D, N, H),
                      lambda x: x.reshape(D, N * H).T),
      ("attn", "k"): (a + "k_proj.weight", lambda w: w.T.reshape(D, K, H),
                      lambda x: x.reshape(D, K * H).T),
      ("attn", "v"): (a + "v_proj.weight", lambda w: w.T.reshape(D, K, H),
                      lambda x: x.reshape(D, K * H).T),
      ("attn", "o"): (a + "o_proj.weight", lambda w: w.T.reshape(N, H, D),
                      lambda x: x.reshape(N * H, D).T),
      ("mlp", "gate"): (m + "gate_proj.weight", np.transpose, np.transpose),
      ("mlp", "up"): (m + "up_proj.weight", np.transpose, np.transpose),
      ("mlp", "down"): (m + "down_proj.weight", np.transpose, np.transpose),
  }
  if cfg.qkv_bias:
    for n, heads in (("q", N), ("k", K), ("v", K)):
      t[("attn", f"{n}_bias")] = (
          a + f"{n}_proj.bias", lambda w, h=heads: w.reshape(h, H),
          lambda x: x.reshape(-1))
  if cfg.qk_norm:
    for n in ("q_norm", "k_norm"):
      t[("attn", n, "scale")] = (a + f"{n}.weight", _ident, _ident)
  for ours, theirs in _layer_norm_names(cfg).items():
    t[(ours, "scale")] = (f"model.layers.{{i}}.{theirs}.weight", _ident,
                          _ident)
  return t


def _ident(x):
  return x


def leaf_builders(cfg: ModelConfig) -> Iterator[tuple[tuple, Callable]]:
  """(tree path, fn(get) -> host array) for every parameter."""
  yield ("embedding",), lambda get: get("model.embed_tokens.weight")
  yield ("final_norm", "scale"), lambda get: get("model.norm.weight")
  if not cfg.tie_embeddings:
    yield ("lm_head",), lambda get: get("lm_head.weight").T
  for path, (name, to_tree, _) in _layer_tensors(cfg).items():
    def build(get, name=name, to_tree=to_tree):
      return np.stack([to_tree(get(name.format(i=i)))
                       for i in range(cfg.num_layers)])
    yield ("layers",) + path, build


def _set(tree: dict, path: tuple, value) -> None:
  for k in path[:-1]:
    tree = tree.setdefault(k, {})
  tree[path[-1]] = value


def _get(tree: dict, path: tuple):
  for k in path:
    tree = tree[k]
  return tree


def assemble(cfg: ModelConfig, get: Getter, *, mesh: Mesh | None = None,
             rules=shd.DEFAULT_RULES, source: str = "checkpoint") -> dict:
  """Builds the param tree from HF-named tensors, placing each leaf."""
  want = decoder.abstract_params(cfg)
  axes = decoder.param_logical_axes(cfg)
  dtype = np.dtype(jax.numpy.dtype(cfg.param_dtype))
  out: dict = {}
  for path, build in leaf_builders(cfg):
    host = np.asarray(build(get)).astype(dtype)
    exp = _get(want, path).shape
    if host.shape != tuple(exp):
      raise CheckpointError(f"{source}: parameter {'/'.join(path)} has shape "
                            f"{host.shape}, the config expects {tuple(exp)}")
    if mesh is None:
      _set(out, path, jax.device_put(host))
    else:
      spec = shd.logical_to_spec(tuple(_get(axes, path)), host.shape, mesh,
                                 rules)
      _set(out, path, shd.place(host, NamedSharding(mesh, spec)))
    del host
  return out


def _safetensor_getter(path: pathlib.Path) -> tuple[Getter, Callable]:
  """A name -> array getter over one or many safetensors files."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  index = path / "model.safetensors.index.json"
  if index.exists():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise CheckpointError(f"{index}: unreadable index ({e})") from None
  else:
    files = sorted(path.glob("*.safetensors"))
    if not files:
      raise CheckpointError(f"{path}: no *.safetensors file and no "
                            "model.safetensors.index.json")
    weight_map = {}
    for f in files:
      for name in _open(f, safe_open).keys():
        weight_map[name] = f.name
  handles = {}

  def get(name: str) -> np.ndarray:
    if name not in weight_map:
      raise CheckpointError(f"{path}: tensor {name!r} is missing from the "
                            "checkpoint")
    fname = weight_map[name]
    if fname not in handles:
      handles[fname] = _open(path / fname, safe_open)
    try:
      return handles[fname].get_tensor(name)
    except Exception as e:  # safetensors raises its own error types.
      raise CheckpointError(f"{path / fname}: cannot read tensor {name!r} "
                            f"({e})") from None

  return get, handles.clear


def _open(f: pathlib.Path, safe_open):
  if not f.exists():
    raise CheckpointError(f"{f}: file is missing")
  try:
    return safe_open(str(f), framework="numpy")
  except Exception as e:
    raise CheckpointError(f"{f}: not a readable safetensors file ({e})") \
        from None


def read_hf_config(path: str | os.PathLike, **overrides) -> ModelConfig:
  f = pathlib.Path(path) / "config.json"
  if not f.exists():
    raise CheckpointError(f"{f}: file is missing")
  try:
    hf = json.loads(f.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{f}: not valid JSON ({e})") from None
  return from_hf_config(hf, source=str(f), **overrides)


def load_hf_dir(path: str | os.PathLike, *, mesh: Mesh | None = None,
                rules=shd.DEFAULT_RULES, **overrides):
  """(ModelConfig, params) from a Hugging Face model directory."""
  path = pathlib.Path(path)
  cfg = read_hf_config(path, **overrides)
  get, close = _safetensor_getter(path)
  try:
    params = assemble(cfg, get, mesh=mesh, rules=rules, source=str(path))
  finally:
    close()
  return cfg, params


def to_hf_tensors(params, cfg: ModelConfig, dtype: str | None = None
                  ) -> dict[str, np.ndarray]:
  """HF-named host tensors from (possibly sharded) params, C-contiguous.

  `safetensors.numpy.save_file` writes an array's buffer as it lies in
  memory: a transposed view would be saved scrambled. (`astype` keeps a
  view's memory order, so the cast is no fix either.)
  """
  fetch = _fetcher()
  cast = np.dtype(jax.numpy.dtype(dtype)) if dtype else None
  host = lambda x: np.ascontiguousarray(x if cast is None else x.astype(cast))
  out = {"model.embed_tokens.weight": host(fetch(params["embedding"])),
         "model.norm.weight": host(fetch(params["final_norm"]["scale"]))}
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = host(fetch(params["lm_head"]).T)
  for path, (name, _, from_tree) in _layer_tensors(cfg).items():
    stacked = fetch(_get(params["layers"], path))
    for i in range(cfg.num_layers):
      out[name.format(i=i)] = host(from_tree(stacked[i]))
  return out


def _fetcher():
  # Several hosts: only arrays sharded across hosts need a collective.
  return lambda x: np.asarray(distributed.to_host(x))


def export_hf_dir(params, cfg: ModelConfig, path: str | os.PathLike, *,
                  tokenizer=None, dtype: str | None = None,
                  max_shard_bytes: int = 4 << 30) -> str:
  """Writes config.json + safetensors (+ tokenizer); atomic per directory."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  tensors = to_hf_tensors(params, cfg, dtype)
  if jax.process_index() != 0:
    return str(path)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=".export-"))
  try:
    hf = to_hf_config(cfg if not dtype else cfg.replace(param_dtype=dtype))
    (tmp / "config.json").write_text(json.dumps(hf, indent=2))
    gen = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
           if hf.get(k) is not None}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
    shards, cur, size = [], {}, 0
    for k, v in tensors.items():
      if cur and size + v.nbytes > max_shard_bytes:
        shards.append(cur)
        cur, size = {}, 0
      cur[k], size = v, size + v.nbytes
    shards.append(cur)
    if len(shards) == 1:
      save_file(shards[0], str(tmp / "model.safetensors"),
                metadata={"format": "pt"})
    else:
      weight_map = {}
      for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(tmp / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
      total = sum(v.nbytes for v in tensors.values())
      (tmp / "model.safetensors.index.json").write_text(json.dumps(
          {"metadata": {"total_size": total}, "weight_map": weight_map},
          indent=2))
    if tokenizer is not None:
      tokenizer.save_hf_dir(str(tmp))
    if path.exists():  # Replace only once the new directory is complete.
      old = path.with_name(path.name + ".old")
      shutil.rmtree(old, ignore_errors=True)
      path.rename(old)
      tmp.rename(path)
      shutil.rmtree(old, ignore_errors=True)
    else:
      tmp.rename(path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return str(path)
