r"""Answer one prompt with a loaded policy (greedy by default).

  python -m swirl_jax.main --config=configs/chat.py \
      --config.prompt="What is the capital of France?" --workdir=/tmp/chat

Args after the colon: `model=<preset>` (default smollm2_135m, the bundled
GGUF), `checkpoint=<path>` (a .gguf file or a Hugging Face directory). Any
other preset without a checkpoint has random weights (the job warns: its
reply is noise); with a checkpoint the preset is not read.
"""

import ml_collections

from swirl_jax import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, model="smollm2_135m", checkpoint="")
  cfg = ml_collections.ConfigDict()
  cfg.job = "chat"
  cfg.model = config_lib.model_config(arg.model, arg.checkpoint or None)
  cfg.prompt = "What is the capital of France? Answer in one sentence."
  cfg.system = ""
  cfg.max_new_tokens = 64
  cfg.temperature = 0.0  # 0: greedy.
  cfg.top_k = 0
  cfg.top_p = 1.0
  cfg.seed = 0
  return cfg
