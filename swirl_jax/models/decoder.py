"""One functional decoder for Llama / SmolLM2, Qwen2, Qwen3 and Gemma 2.

Parameters are a pytree; `forward(params, cfg, tokens, ...)` gives logits and,
when a KV cache is passed in, the updated cache.

Without a cache (training, scoring) layers are stacked and scanned: params
carry a leading 'layers' axis, so compile time does not grow with depth.
With a KV cache (prefill, extend, decode) the layers run one after another
over their own params (`split_layers`), each handing its new keys / values
to the cache's attention (`cached_hidden_states`): scanning stacked layers
instead slices a copy of every layer's weights (and cache) on every decode
step. The cache is a pool of pages (models/paged.py): a call names each
row's page table and how many tokens it holds (`paged.Rows`); its new
tokens' keys / values are written into their pages in place and each new
token attends over its row's earlier tokens and the new ones up to itself.
Rows hold no padding: a row's slot s holds its token at position s.

LoRA is a side path: `params['lora']`, laid out like `params`, holds
`{'a': [*in, r], 'b': [r, *out]}` (scale folded into b; training/lora.py)
for some projections, which then compute `x @ W + (x @ a) @ b`: no merged
weight, nor a gradient the size of W, ever exists.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from swirl_jax.models import attention, paged
from swirl_jax.models.config import ModelConfig
from swirl_jax.sharding import constrain

Cache = paged.Cache


def _dt(name: str):
  return jnp.dtype(name)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse RoPE frequencies, with llama3 scaling when configured."""
  d = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))
  s = cfg.rope_scaling
  if not s:
    return inv.astype(np.float32)
  factor, lo, hi = s.factor, s.low_freq_factor, s.high_freq_factor
  old = s.original_max_position_embeddings
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > old / lo, inv / factor, inv)
  smooth = (old / wavelen - lo) / (hi - lo)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x_BTNH: jax.Array, pos_BT: jax.Array, inv_freq) -> jax.Array:
  """Rotate-half RoPE (the Hugging Face layout of q/k rows)."""
  ang = pos_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTNH.dtype)


def dense(x, w, **dot_kw):
  """`x [..., d] @ w [d, ...]` as one 2-D `[rows, d] x [d, n]` matmul.

  Flattening the leading dims (and the weight's trailing ones) matters on
  CPUs: with (b, t) as two contracting dims the backward pass transposes
  activations into other layouts, and an MLP's fwd + bwd at 2 x 512 rows
  runs 1.5x slower than with one row dim.
  """
  d = x.shape[-1]
  y = jnp.dot(x.reshape(-1, d), w.reshape(d, -1), **dot_kw)
  return y.reshape(*x.shape[:-1], *w.shape[1:])


def project(mod: nn.Module, name: str, x, w):
  """`dense(x, w)` plus the LoRA side path `(x @ a) @ b` when the module's
  'lora' collection holds an adapter `name` (see the module doc)."""
  y = dense(x, w)
  ab = mod.get_variable("lora", name)
  if ab is None:
    return y
  h = dense(x, ab["a"].astype(w.dtype).reshape(x.shape[-1], -1))
  return y + dense(h, ab["b"].astype(w.dtype))


def _param(mod, name, axes, shape, init, dtype):
  return mod.param(name, nn.with_logical_partitioning(init, axes), shape,
                   _dt(dtype))


_W_INIT = nn.initializers.normal(stddev=0.02)


class RMSNorm(nn.Module):
  """Over the last axis, whose logical name is `axis`."""
  cfg: ModelConfig
  axis: str = "embed"

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    # Gemma stores (scale - 1): zeros init and `x * (1 + w)`.
    init = nn.initializers.zeros if c.is_gemma else nn.initializers.ones
    w = _param(self, "scale", (self.axis,), x.shape[-1:], init, c.param_dtype)
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + c.norm_eps)
    if c.is_gemma:
      return (y * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
    return w.astype(x.dtype) * y.astype(x.dtype)


class Attention(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, pos_BT, mask_BTS, sliding=False, cached=None):
    """Attends over the new tokens alone, or through a KV cache.

    `cached(q [B, T, N, H], k [B, T, K, H], v [B, T, K, H], sliding) ->
    (o [B, T, N * H], aux)`: the cache's attention (it stores the new keys
    and values and attends over the cache); `mask_BTS` is then unused.

    Returns:
      (output [B, T, D], the cache's `aux` or None).
    """
    c, dt = self.cfg, _dt(self.cfg.dtype)
    D, N, K, H = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    p = lambda n, ax, sh, init=_W_INIT: _param(self, n, ax, sh, init,
                                               c.param_dtype).astype(dt)
    q = project(self, "q", x_BTD,
                p("q", ("embed", "heads", "head_dim"), (D, N, H)))
    k = project(self, "k", x_BTD,
                p("k", ("embed", "kv_heads", "head_dim"), (D, K, H)))
    v = project(self, "v", x_BTD,
                p("v", ("embed", "kv_heads", "head_dim"), (D, K, H)))
    if c.qkv_bias:
      zeros = nn.initializers.zeros
      q = q + p("q_bias", ("heads", "head_dim"), (N, H), zeros)
      k = k + p("k_bias", ("kv_heads", "head_dim"), (K, H), zeros)
      v = v + p("v_bias", ("kv_heads", "head_dim"), (K, H), zeros)
    if c.qk_norm:  # One scale per head_dim entry, shared by the heads.
      q = RMSNorm(c, "head_dim", name="q_norm")(q)
      k = RMSNorm(c, "head_dim", name="k_norm")(k)
    inv = rope_inv_freq(c)
    q, k = apply_rope(q, pos_BT, inv), apply_rope(k, pos_BT, inv)
    q = constrain(q, ("batch", "length", "act_heads", None))
    if cached is None:
      o, aux = attention.no_cache(c, q, k, v, mask_BTS, sliding), None
    else:
      o, aux = cached(q, k, v, sliding)
    w_o = p("o", ("heads", "head_dim", "embed"), (N, H, D))
    # One (n h) x d product: with (n, h) as two contracting dims XLA may
    # transpose the weight, a copy of it on every call.
    out = project(self, "o", o, w_o.reshape(N * H, D))
    return out, aux


class MLP(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    c, dt = self.cfg, _dt(self.cfg.dtype)
    D, F = c.hidden_size, c.intermediate_size
    p = lambda n, ax, sh: _param(self, n, ax, sh, _W_INIT,
                                 c.param_dtype).astype(dt)
    gate = project(self, "gate", x_BTD, p("gate", ("embed", "mlp"), (D, F)))
    up = project(self, "up", x_BTD, p("up", ("embed", "mlp"), (D, F)))
    act = (nn.gelu(gate, approximate=True) if c.is_gemma else nn.silu(gate))
    h = constrain(act * up, ("batch", "length", "act_mlp"))
    return project(self, "down", h, p("down", ("mlp", "embed"), (F, D)))


class Layer(nn.Module):
  """One pre-norm block; Gemma 2 adds post-norms."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, layer_idx, pos_BT, mask_full, mask_slide,
               cached=None):
    """`cached`: this layer's cache attention (see `Attention`), or None;
    with it `layer_idx` is a Python int and the masks are unused."""
    c = self.cfg
    if cached is not None:
      sliding, mask = c.sliding_layers[layer_idx], None
    else:
      flag = jnp.asarray(c.sliding_layers)[layer_idx]
      mask = jnp.where(flag, mask_slide, mask_full)
      kinds = set(c.sliding_layers)  # Static when all layers are alike.
      sliding = kinds.pop() if len(kinds) == 1 else flag
    h, aux = Attention(c, name="attn")(
        RMSNorm(c, name="input_norm")(x), pos_BT, mask, sliding, cached)
    if c.is_gemma:
      h = RMSNorm(c, name="post_attn_norm")(h)
    x = x + h
    pre = "pre_ffw_norm" if c.is_gemma else "post_attn_norm"
    h = MLP(c, name="mlp")(RMSNorm(c, name=pre)(x))
    if c.is_gemma:
      h = RMSNorm(c, name="post_ffw_norm")(h)
    x = constrain(x + h, ("batch", "length", "act_embed"))
    return x, aux


_REMAT = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def embed_tokens(embedding, cfg: ModelConfig, tokens_BT):
  """Input embeddings; Gemma scales them by sqrt(hidden_size)."""
  dt = _dt(cfg.dtype)
  x = jnp.take(embedding.astype(dt), tokens_BT, axis=0)
  if cfg.is_gemma:
    x = x * jnp.asarray(math.sqrt(cfg.hidden_size), dt)
  return constrain(x, ("batch", "length", "act_embed"))


class Decoder(nn.Module):
  cfg: ModelConfig

  def setup(self):
    c = self.cfg
    self.embedding = _param(self, "embedding", ("vocab", "embed"),
                            (c.vocab_size, c.hidden_size), _W_INIT,
                            c.param_dtype)
    layer = Layer
    if c.remat not in _REMAT:
      raise ValueError(f"remat {c.remat!r}; valid: {sorted(_REMAT)}")
    if _REMAT[c.remat] is not None:
      layer = nn.remat(Layer, prevent_cse=False, policy=_REMAT[c.remat])
    self.layers = nn.scan(
        layer, variable_axes={"params": 0, "lora": 0}, split_rngs={"params": True},
        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
        length=c.num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"})(c, name="layers")
    self.final_norm = RMSNorm(c)
    if not c.tie_embeddings:
      self.lm_head = _param(self, "lm_head", ("embed", "vocab"),
                            (c.hidden_size, c.vocab_size), _W_INIT,
                            c.param_dtype)

  def __call__(self, tokens_BT, pos_BT, mask_BT):
    """Final normed hidden states [B, T, D] (no cache: see the module doc)."""
    c = self.cfg
    x = embed_tokens(self.embedding, c, tokens_BT)
    k_pos, k_valid = pos_BT, mask_BT.astype(bool)
    T = tokens_BT.shape[1]
    causal = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
    mask_full, mask_slide = _masks(c, pos_BT, k_pos, k_valid, causal)
    x, _ = self.layers(x, jnp.arange(c.num_layers), pos_BT, mask_full,
                       mask_slide)
    return self.final_norm(x)

  def unembed(self, h_BTD):
    """Logits from hidden states (float32), with Gemma 2's final soft-cap."""
    sub = {"embedding": self.embedding} if self.cfg.tie_embeddings else \
        {"lm_head": self.lm_head}
    return unembed_with(sub, self.cfg, h_BTD)


def _masks(c: ModelConfig, q_pos_BT, k_pos_BS, k_valid_BS, causal_TS):
  """[B, T, S] visibility of keys to queries: valid key, causal (by token
  order), and for sliding layers within the window (by position)."""
  full = k_valid_BS[:, None, :] & causal_TS[None]
  slide = full
  if c.sliding_window and any(c.sliding_layers):
    dist = q_pos_BT[:, :, None] - k_pos_BS[:, None, :]
    slide = full & (dist < c.sliding_window)
  return full, slide


# ---------------------------------------------------------------- functional


def split_layers(params):
  """Params with 'layers' as a tuple of per-layer trees (the cached path's
  layout); params already split are returned as they are. Outside jit this
  makes the per-layer copies once, so decode steps never slice them."""
  layers = params["layers"]
  if isinstance(layers, (tuple, list)):
    return params
  n = jax.tree.leaves(layers)[0].shape[0]
  return dict(params, layers=tuple(jax.tree.map(lambda x, i=i: x[i], layers)
                                   for i in range(n)))


def cached_hidden_states(params, cfg: ModelConfig, tokens_BT, pos_BT,
                         attend):
  """Final normed hidden states of new tokens whose attention goes through
  a KV cache: `attend(i, q, k, v, sliding) -> (o, aux)` for layer i (see
  `Attention`). Returns (hidden states, [aux of each layer])."""
  c = cfg
  params = split_layers(params)
  side = split_layers(params["lora"])["layers"] if "lora" in params else None
  x = embed_tokens(params["embedding"], c, tokens_BT)
  auxes = []
  for i, layer_params in enumerate(params["layers"]):
    lora = {"lora": side[i]} if side else {}
    x, aux = Layer(c).apply({"params": layer_params, **lora}, x, i, pos_BT,
                            None, None, functools.partial(attend, i))
    auxes.append(aux)
  return RMSNorm(c).apply({"params": params["final_norm"]}, x), auxes


def _paged_hidden_states(params, cfg: ModelConfig, tokens_BT, pos_BT,
                         mask_BT, cache: Cache, rows: paged.Rows):
  """New tokens (right-padded, real where `mask_BT`, at positions = their
  slots) written at slots start .. start + T of their rows' pages; each
  layer attends over a view of the rows' prefix pages, gathered, and the
  new tokens (as the pages store them: in the cache dtype)."""
  T = tokens_BT.shape[1]
  n = paged.prefix_pages(rows, T, paged.page_size(cache))
  S = n * paged.page_size(cache)
  masks = paged.view_masks(cfg, rows.start_B, S,
                           jnp.arange(T, dtype=jnp.int32), S + T)
  dt = _dt(cfg.dtype)

  def attend(i, q, k, v, sliding):
    kp, vp = paged.write(cache["k"][i], cache["v"][i], rows, k, v, mask_BT)
    prefix = paged.gather(kp, vp, rows.table_BN[:, :n], dt) if n else None
    stored = lambda x: x.astype(kp.dtype).astype(dt)
    view_k, view_v = paged.with_new(prefix, stored(k), stored(v))
    o = attention.attend(cfg, q, view_k, view_v, masks[int(sliding)],
                         keys_last=True)
    return o, (kp, vp)

  h, pools = cached_hidden_states(params, cfg, tokens_BT, pos_BT, attend)
  return h, paged.constrain_pool(dict(k=tuple(k for k, _ in pools),
                                      v=tuple(v for _, v in pools)))


def default_positions(mask_BT: jax.Array) -> jax.Array:
  """Positions that skip padding (left or right): cumsum(mask) - 1, >= 0."""
  return jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1, 0)


def hidden_states(params, cfg: ModelConfig, tokens_BT, positions_BT=None,
                  mask_BT=None, cache: Cache | None = None,
                  rows: paged.Rows | None = None):
  """Final normed hidden states [B, T, D], and the updated cache (None
  without one). With a cache, `rows` says where each row's tokens are;
  its new tokens are right-padded and their positions are their slots
  (start, start + 1, ...: the default)."""
  if mask_BT is None:
    mask_BT = jnp.ones(tokens_BT.shape, bool)
  mask_BT = mask_BT.astype(bool)
  if cache is not None:
    if positions_BT is None:
      positions_BT = rows.start_B[:, None] + default_positions(mask_BT)
    return _paged_hidden_states(params, cfg, tokens_BT, positions_BT,
                                mask_BT, cache, rows)
  if positions_BT is None:
    positions_BT = default_positions(mask_BT)
  variables = {"params": {k: v for k, v in params.items() if k != "lora"}}
  if "lora" in params:
    variables["lora"] = params["lora"]
  return Decoder(cfg).apply(variables, tokens_BT, positions_BT,
                            mask_BT), None


def unembed(params, cfg: ModelConfig, h):
  return unembed_with(unembed_params(params, cfg), cfg, h)


def unembed_params(params, cfg: ModelConfig) -> dict:
  """The sub-tree `unembed` reads (for chunked log-probs)."""
  keys = ["embedding"] if cfg.tie_embeddings else ["lm_head"]
  return {k: params[k] for k in keys}


def unembed_with(sub, cfg: ModelConfig, h):
  """`unembed` from the sub-tree of `unembed_params` alone."""
  c, dt = cfg, _dt(cfg.dtype)
  w = sub["embedding"].astype(dt).T if c.tie_embeddings else \
      sub["lm_head"].astype(dt)
  logits = dense(h.astype(dt), w, preferred_element_type=jnp.float32)
  if c.final_logit_softcap:
    logits = jnp.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
  return logits


def forward(params, cfg: ModelConfig, tokens_BT, positions_BT=None,
            mask_BT=None, cache: Cache | None = None,
            rows: paged.Rows | None = None):
  """Logits [B, T, V] (float32) and the updated cache (None without one)."""
  h, cache = hidden_states(params, cfg, tokens_BT, positions_BT, mask_BT,
                           cache, rows)
  return unembed_with(unembed_params(params, cfg), cfg, h), cache


def _boxed_init(cfg: ModelConfig, rng):
  t = jnp.zeros((1, 1), jnp.int32)
  return Decoder(cfg).init(rng, t, t, jnp.ones((1, 1), bool))["params"]


def param_logical_axes(cfg: ModelConfig):
  """Tree of logical PartitionSpecs, shaped like the params."""
  boxed = jax.eval_shape(functools.partial(_boxed_init, cfg),
                         jax.random.key(0))
  return nn.get_partition_spec(boxed)


def abstract_params(cfg: ModelConfig):
  """ShapeDtypeStructs of the params (no allocation)."""
  return nn.unbox(jax.eval_shape(functools.partial(_boxed_init, cfg),
                         jax.random.key(0)))


def init_params(cfg: ModelConfig, rng, shardings=None):
  """Random params, created already sharded when shardings are given."""
  fn = lambda r: nn.unbox(_boxed_init(cfg, r))
  return jax.jit(fn, out_shardings=shardings)(rng)
