"""Sampling with a KV cache: `sampler.Sampler` (multi-turn, host side),
`decoding` (pure prefill / extend / decode), `distribution` (temperature,
top-k, top-p), `stops` (stop strings matched across token boundaries)."""
