"""The `chat` job: answer `config.prompt` with a loaded policy."""

import pathlib

from absl import logging

from swirl_jax.models import loading
from swirl_jax.sampling.sampler import Sampler, SamplerConfig


def reply(policy, prompt: str, *, system: str = "", max_new_tokens=64,
          temperature=0.0, top_k=0, top_p=1.0, seed=0) -> str:
  cfg, params, tok = policy
  messages = ([{"role": "system", "content": system}] if system else []) + [
      {"role": "user", "content": prompt}]
  ids = tok.encode(tok.apply_chat_template(messages,
                                           add_generation_prompt=True))
  sampler = Sampler(params, cfg, tok, SamplerConfig(
      max_cache_len=len(ids) + max_new_tokens + 16))
  res = sampler.generate([ids], max_new_tokens=max_new_tokens,
                         temperature=temperature, top_k=top_k, top_p=top_p,
                         seed=seed)
  return res.texts[0]


def run(config, workdir: str) -> str:
  c = config
  if not c.model.checkpoint:
    logging.warning("model.checkpoint is empty: preset %r has random weights,"
                    " so the reply is noise (give checkpoint=<.gguf file or "
                    "Hugging Face directory>, or 'bundled')", c.model.preset)
  text = reply(loading.load_policy(c.model, seed=c.seed), c.prompt,
               system=c.system, max_new_tokens=c.max_new_tokens,
               temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
               seed=c.seed)
  print(text)
  pathlib.Path(workdir, "reply.txt").write_text(text + "\n")
  return text
