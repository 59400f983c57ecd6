"""Model presets by name. Shapes follow each model's published config.json."""

from swirl_jax.models.config import (FULL, SLIDING, Llama3RopeScaling,
                                     ModelConfig)


def _alternating(n: int) -> tuple[str, ...]:
  # Gemma 2: even layers (0, 2, ...) use the sliding window.
  return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n))


def _gemma2(**kw) -> ModelConfig:
  base = dict(family="gemma2", vocab_size=256000, norm_eps=1e-6,
              rope_theta=10000.0, tie_embeddings=True,
              attn_logit_softcap=50.0, final_logit_softcap=30.0,
              sliding_window=4096, bos_token_id=2, eos_token_id=(1, 107),
              pad_token_id=0)
  base.update(kw)
  base["layer_types"] = _alternating(base["num_layers"])
  return ModelConfig(**base)


def _qwen3(**kw) -> ModelConfig:
  # Shared by Qwen/Qwen3-{0.6B,1.7B,4B,8B}/config.json.
  base = dict(family="qwen3", vocab_size=151936, num_kv_heads=8,
              head_dim=128, norm_eps=1e-6, rope_theta=1e6,
              bos_token_id=151643, eos_token_id=151645,
              max_position_embeddings=40960)
  base.update(kw)
  return ModelConfig(**base)


PRESETS = {
    "tiny": lambda: ModelConfig(
        family="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16),
    # CPU demos: trained from scratch on a narrow domain, usually with a
    # small vocabulary learnt for it (`Tokenizer.train_like`).
    "mini": lambda: ModelConfig(
        family="llama", vocab_size=256, hidden_size=128,
        intermediate_size=512, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=32, tie_embeddings=True),
    "smollm2_135m": lambda: ModelConfig(
        family="llama", vocab_size=49152, hidden_size=576,
        intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, norm_eps=1e-5, rope_theta=100000.0, tie_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2),
    "qwen2_5_0_5b": lambda: ModelConfig(
        family="qwen2", vocab_size=151936, hidden_size=896,
        intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
        head_dim=64, norm_eps=1e-6, rope_theta=1e6, tie_embeddings=True,
        qkv_bias=True, eos_token_id=151643, max_position_embeddings=32768),
    "qwen2_5_7b": lambda: ModelConfig(
        family="qwen2", vocab_size=152064, hidden_size=3584,
        intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
        head_dim=128, norm_eps=1e-6, rope_theta=1e6, tie_embeddings=False,
        qkv_bias=True, eos_token_id=151643, max_position_embeddings=131072),
    "llama3_2_1b": lambda: ModelConfig(
        family="llama", vocab_size=128256, hidden_size=2048,
        intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8,
        head_dim=64, norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=Llama3RopeScaling(
            factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=8192),
        tie_embeddings=True, bos_token_id=128000,
        eos_token_id=(128001, 128008, 128009), max_position_embeddings=131072),
    "qwen3_0_6b": lambda: _qwen3(
        hidden_size=1024, intermediate_size=3072, num_layers=28,
        num_heads=16, tie_embeddings=True),
    "qwen3_1_7b": lambda: _qwen3(
        hidden_size=2048, intermediate_size=6144, num_layers=28,
        num_heads=16, tie_embeddings=True),
    "qwen3_4b": lambda: _qwen3(
        hidden_size=2560, intermediate_size=9728, num_layers=36,
        num_heads=32, tie_embeddings=True),
    "qwen3_8b": lambda: _qwen3(
        hidden_size=4096, intermediate_size=12288, num_layers=36,
        num_heads=32, tie_embeddings=False),
    "gemma2_2b": lambda: _gemma2(
        hidden_size=2304, intermediate_size=9216, num_layers=26, num_heads=8,
        num_kv_heads=4, head_dim=256, query_pre_attn_scalar=256),
    "gemma2_9b": lambda: _gemma2(
        hidden_size=3584, intermediate_size=14336, num_layers=42,
        num_heads=16, num_kv_heads=8, head_dim=256, query_pre_attn_scalar=256),
    "gemma2_27b": lambda: _gemma2(
        hidden_size=4608, intermediate_size=36864, num_layers=46,
        num_heads=32, num_kv_heads=16, head_dim=128,
        query_pre_attn_scalar=144),
}


def get_preset(name: str, **overrides) -> ModelConfig:
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; valid: {sorted(PRESETS)}")
  return PRESETS[name]().replace(**overrides)
