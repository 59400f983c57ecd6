"""Accelerator chips: HBM per chip, peak dense bf16 FLOP/s, HBM bandwidth.

Figures are per chip (a TPU chip, one GPU), from the vendors' datasheets:
  v4    cloud.google.com/tpu/docs/v4: 32 GiB HBM2, 275 TFLOP/s bf16,
        1,200 GB/s.
  v5e   cloud.google.com/tpu/docs/v5e: 16 GiB HBM2, 197 TFLOP/s bf16,
        819 GB/s.
  v5p   cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e, 459 TFLOP/s bf16,
        2,765 GB/s.
  v6e   cloud.google.com/tpu/docs/v6e: 32 GiB HBM, 918 TFLOP/s bf16,
        1,640 GB/s.
  a100  NVIDIA A100 datasheet (SXM4 80GB): 80 GB HBM2e, 312 TFLOP/s dense
        bf16, 2,039 GB/s.
  h100  NVIDIA H100 datasheet (SXM5): 80 GB HBM3, 989 TFLOP/s dense bf16
        (1,979 with sparsity), 3.35 TB/s.
  h200  NVIDIA H200 datasheet (SXM): 141 GB HBM3e, 989 TFLOP/s dense bf16,
        4.8 TB/s.
Chips per host: a TPU VM host of a multi-host v4 / v5e / v5p / v6e slice
drives 4 chips; a GPU node 8 (DGX / HGX).
NVIDIA's "80 GB" is 80 GiB of HBM (81,920 MiB on an A100; an H100 reports
81,559 MiB); an H200 reports 143,771 MiB, i.e. 140 GiB.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_gib: float
  peak_bf16_flops: float  # Dense (no sparsity).
  hbm_bytes_s: float
  host_chips: int  # Chips a host of a multi-host slice / node drives.


CHIPS = {c.name: c for c in (
    Chip("v4", 32.0, 275e12, 1.2e12, 4),
    Chip("v5e", 16.0, 197e12, 0.819e12, 4),
    Chip("v5p", 95.0, 459e12, 2.765e12, 4),
    Chip("v6e", 32.0, 918e12, 1.64e12, 4),
    Chip("a100", 80.0, 312e12, 2.039e12, 8),
    Chip("h100", 79.6, 989e12, 3.35e12, 8),
    Chip("h200", 140.0, 989e12, 4.8e12, 8),
)}

# Substrings of `jax.Device.device_kind` -> chip (first match wins).
_KINDS = (("h200", "h200"), ("h100", "h100"), ("a100", "a100"),
          ("v6", "v6e"), ("v5 lite", "v5e"), ("v5e", "v5e"), ("v5", "v5p"),
          ("v4", "v4"))


def get(name: str) -> Chip:
  if name not in CHIPS:
    raise ValueError(f"unknown chip {name!r}; valid: {', '.join(CHIPS)}")
  return CHIPS[name]


def detect(device_kind: str) -> Chip | None:
  """The chip for a `device_kind` string ('NVIDIA H200', 'TPU v5 lite');
  None when it is not in the table (a CPU, an unlisted GPU)."""
  kind = device_kind.lower()
  for key, name in _KINDS:
    if key in kind:
      return CHIPS[name]
  return None
