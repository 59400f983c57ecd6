"""swirl_jax: SWiRL and SimpleTIR for tool-using LM agents in JAX/Flax."""

import setuptools

CORE = [
    "jax>=0.6",
    # 0.7.0 takes 0.7 s to import its extension (0.07 s for 0.6.0 and
    # 0.5.4), which every process that imports jax pays: over half of
    # `import jax` on the 2-core Xeon.
    "ml_dtypes>=0.5,!=0.7.0",
    "flax>=0.10",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "ml-collections>=0.1.1",
    "absl-py>=2.1",
    "numpy>=1.26",
    "transformers>=4.46",
    "huggingface_hub>=0.24",  # The data job (swirl_jax/tasks/prepare.py).
    "tokenizers>=0.20",
    "safetensors>=0.4",
    "gguf>=0.10",
    "jinja2>=3.1",
    "sympy>=1.12",
    "math-verify>=0.7",
    "bm25s>=0.2",
    "pyarrow>=15",
    "tensorboardX>=2.6",
    "tqdm>=4.66",
    "requests>=2.31",
    "urllib3>=2",
    "matplotlib>=3.8",
]

EXTRAS = {
    # Parity tests and peer benchmarks only; never imported by the package.
    "torch": ["torch==2.13.0"],
    "test": [
        "pytest>=8",
        "pytest-xdist>=3.5",
        "hypothesis>=6.100",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        "torch==2.13.0",
        "selenium>=4.20",  # The rollout viewer in headless Chromium.
    ],
    # Optional W&B export of a run (swirl_jax/viewer/wandb_log.py).
    "wandb": ["wandb>=0.17"],
}

setuptools.setup(
    name="swirl_jax",
    version="0.1.0",
    description="Step-wise and multi-turn RL for tool-using LM agents in JAX",
    packages=setuptools.find_packages(include=["swirl_jax", "swirl_jax.*"]),
    package_data={"swirl_jax.viewer": ["assets/*"]},  # The page, JS, CSS.
    license="Apache-2.0",
    # Tested on 3.11; JAX needs 3.11 or newer from 0.7 on.
    python_requires=">=3.11",
    install_requires=CORE,
    extras_require=EXTRAS,
)
