"""Sampling with a KV cache: `sampler.Sampler` (multi-turn, host side),
`pages` (the page pool's programs and the device that hands out its
pages), `decoding` (pure extend / decode), `distribution` (temperature,
top-k, top-p), `stops` (stop strings matched across token boundaries)."""
