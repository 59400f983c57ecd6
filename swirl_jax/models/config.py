"""Decoder hyper-parameters, and their translation to/from Hugging Face.

`ModelConfig` is frozen and hashable (mappings and lists given to it become
a frozen dataclass and tuples), so it can be a jit static argument or a
cache key as it is.
"""

import dataclasses
from typing import Mapping

FAMILIES = ("llama", "qwen2", "qwen3", "gemma2")
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """Llama 3's RoPE frequency scaling (HF `rope_type: llama3`)."""
  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  @classmethod
  def from_mapping(cls, m: Mapping) -> "Llama3RopeScaling":
    try:
      return cls(float(m["factor"]), float(m["low_freq_factor"]),
                 float(m["high_freq_factor"]),
                 int(m["original_max_position_embeddings"]))
    except KeyError as e:
      raise ValueError(f"llama3 rope scaling: missing field {e.args[0]!r}") \
          from None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """One decoder covers Llama / SmolLM2, Qwen2, Qwen3 and Gemma 2."""
  family: str = "llama"
  vocab_size: int = 256
  hidden_size: int = 64
  intermediate_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  # None or Llama3RopeScaling (a mapping with its fields is converted).
  rope_scaling: Llama3RopeScaling | None = None
  tie_embeddings: bool = True
  qkv_bias: bool = False  # Qwen2.
  # Gemma 2 specifics.
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  query_pre_attn_scalar: float | None = None  # None: head_dim.
  sliding_window: int | None = None
  layer_types: tuple[str, ...] | None = None  # None: all full attention.
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None  # a list: a tuple.
  pad_token_id: int | None = None
  max_position_embeddings: int = 8192
  # Numerics and memory.
  dtype: str = "float32"  # activations: bfloat16 on accelerators.
  param_dtype: str = "float32"
  remat: str = "none"  # none | full | dots: rematerialise each layer.
  # Without a KV cache (training, scoring) attention runs over blocks of
  # about this many queries, each over the keys up to its own last one: the
  # causal upper half is never computed. At most 16 blocks; 0: one block.
  attn_query_block: int = 128
  # Attention without a cache: auto | xla_blocks | dot_product | splash
  # (models/attention.py); auto picks by backend.
  attention_impl: str = "auto"
  # Attention over the KV cache's pages (sampling): auto | xla | pallas
  # (models/paged.py); auto picks by backend.
  paged_attention_impl: str = "auto"

  def __post_init__(self):
    self._freeze()
    if self.family not in FAMILIES:
      raise ValueError(f"model family {self.family!r} is not one of {FAMILIES}")
    if self.family == "qwen3" and self.qkv_bias:
      raise ValueError("qwen3 has no q/k/v biases (qkv_bias=True)")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.layer_types is not None:
      if len(self.layer_types) != self.num_layers:
        raise ValueError(f"layer_types has {len(self.layer_types)} entries "
                         f"for num_layers={self.num_layers}")
      bad = set(self.layer_types) - {SLIDING, FULL}
      if bad:
        raise ValueError(f"unknown layer_types {sorted(bad)}; valid: "
                         f"{SLIDING!r}, {FULL!r}")

  def _freeze(self):
    """Mappings and lists -> their hashable forms (configs built from JSON
    or from `--config.` overrides hold dicts and lists)."""
    fix = lambda name, value: object.__setattr__(self, name, value)
    if isinstance(self.rope_scaling, Mapping):
      fix("rope_scaling", Llama3RopeScaling.from_mapping(self.rope_scaling))
    if isinstance(self.eos_token_id, (list, tuple)):
      fix("eos_token_id", tuple(int(i) for i in self.eos_token_id))
    if self.layer_types is not None:
      fix("layer_types", tuple(self.layer_types))

  @property
  def is_gemma(self) -> bool:
    return self.family == "gemma2"

  @property
  def qk_norm(self) -> bool:
    """Qwen3: RMSNorm over each head's queries and keys, before RoPE."""
    return self.family == "qwen3"

  @property
  def sliding_layers(self) -> tuple[bool, ...]:
    if self.layer_types is None or self.sliding_window is None:
      return (False,) * self.num_layers
    return tuple(t == SLIDING for t in self.layer_types)

  @property
  def attn_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)


_HF_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma2": "gemma2"}
_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
          "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}
# transformers' config defaults where a config.json leaves a field out.
_TIED_BY_DEFAULT = {"qwen2", "gemma2"}
_HEAD_DIM_DEFAULT = {"qwen3": 128}  # Else hidden_size // heads.


def _rope(hf: dict) -> tuple[float, Llama3RopeScaling | None]:
  """Reads rope theta/scaling from both the old and the new HF layouts."""
  params = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or params or None
  theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
  if scaling:
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
      scaling = None
    elif kind == "llama3":
      scaling = Llama3RopeScaling.from_mapping(scaling)
    else:
      raise ValueError(f"config.json: rope type {kind!r} is not supported "
                       "(supported: default, llama3)")
  return float(theta), scaling


def from_hf_config(hf: dict, *, source: str = "config.json", **overrides
                   ) -> ModelConfig:
  """Builds a ModelConfig from a Hugging Face `config.json` dict."""
  mtype = hf.get("model_type")
  if mtype not in _HF_TYPES:
    raise ValueError(f"{source}: model_type {mtype!r} is not supported "
                     f"(supported: {sorted(_HF_TYPES)})")
  _check_qwen3(hf, source)
  try:
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    kw = dict(
        family=_HF_TYPES[mtype], vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or _HEAD_DIM_DEFAULT.get(
            mtype, hf["hidden_size"] // heads),
        norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=hf.get("tie_word_embeddings",
                              mtype in _TIED_BY_DEFAULT),
        qkv_bias=mtype == "qwen2" or bool(hf.get("attention_bias", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        pad_token_id=hf.get("pad_token_id"),
        max_position_embeddings=hf.get("max_position_embeddings", 8192))
  except KeyError as e:
    raise ValueError(f"{source}: missing field {e.args[0]!r}") from None
  if mtype == "gemma2":
    layers = hf.get("layer_types") or [
        SLIDING if (i + 1) % 2 else FULL
        for i in range(hf["num_hidden_layers"])]
    kw.update(
        attn_logit_softcap=hf.get("attn_logit_softcapping"),
        final_logit_softcap=hf.get("final_logit_softcapping"),
        query_pre_attn_scalar=hf.get("query_pre_attn_scalar"),
        sliding_window=hf.get("sliding_window"),
        layer_types=tuple(layers))
  kw.update(overrides)
  return ModelConfig(**kw)


def _check_qwen3(hf: dict, source: str) -> None:
  """Qwen3 options the decoder does not implement fail loudly."""
  if hf.get("model_type") != "qwen3":
    return
  if hf.get("attention_bias"):
    raise ValueError(f"{source}: qwen3 with attention_bias=true (biased "
                     "q/k/v/o projections) is not supported")
  if hf.get("use_sliding_window"):
    raise ValueError(f"{source}: qwen3 with use_sliding_window=true is not "
                     "supported")


def to_hf_config(cfg: ModelConfig) -> dict:
  """The Hugging Face `config.json` dict for a ModelConfig."""
  hf = dict(
      architectures=[_ARCHS[cfg.family]], model_type=cfg.family,
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
      rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
      tie_word_embeddings=cfg.tie_embeddings,
      max_position_embeddings=cfg.max_position_embeddings,
      bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
      pad_token_id=cfg.pad_token_id, torch_dtype=cfg.param_dtype)
  rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling:
    rope = {"rope_type": "llama3", "rope_theta": cfg.rope_theta,
            **dataclasses.asdict(cfg.rope_scaling)}
    hf["rope_scaling"] = dict(rope)
  hf["rope_parameters"] = rope
  if cfg.family == "llama":
    hf.update(hidden_act="silu", attention_bias=cfg.qkv_bias,
              mlp_bias=False)
  elif cfg.family == "qwen2":
    hf.update(hidden_act="silu", use_sliding_window=False)
  elif cfg.family == "qwen3":
    hf.update(hidden_act="silu", attention_bias=False,
              use_sliding_window=False, sliding_window=None,
              max_window_layers=cfg.num_layers)
  else:
    hf.update(hidden_activation="gelu_pytorch_tanh",
              attn_logit_softcapping=cfg.attn_logit_softcap,
              final_logit_softcapping=cfg.final_logit_softcap,
              query_pre_attn_scalar=cfg.query_pre_attn_scalar,
              sliding_window=cfg.sliding_window,
              layer_types=list(cfg.layer_types or ()))
  return hf
