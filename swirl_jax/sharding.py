"""Device mesh from config, logical-axis rules, and sharded placement.

Model code names logical axes only ('embed', 'heads', ...); the rules here map
them onto mesh axes. A mesh axis that does not divide a dimension is dropped
for that array (e.g. SmolLM2's 9 heads on tensor=2), so every preset runs on
every mesh, replicated where it must be.
"""

import contextlib
import contextvars
import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

# Logical axis -> mesh axes. Batch over data and fsdp; weights sharded over
# fsdp on their embed dimension and over tensor on heads / mlp / vocab.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("cache_length", None),
)


def make_mesh(spec: Sequence[tuple[str, int]], devices=None) -> Mesh:
  """`[('data', -1), ('fsdp', 1), ('tensor', 1)]` -> Mesh; one -1 fills."""
  devices = list(devices if devices is not None else jax.devices())
  names = [str(n) for n, _ in spec]
  sizes = [int(s) for _, s in spec]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh {spec}: at most one axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"mesh {spec}: {len(devices)} devices are not a "
                       f"multiple of {known}")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"mesh {spec} needs {math.prod(sizes)} devices; "
                     f"{len(devices)} available")
  return jax.make_mesh(tuple(sizes), tuple(names),
                       axis_types=(AxisType.Auto,) * len(names),
                       devices=devices)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int],
                    mesh: Mesh, rules=DEFAULT_RULES) -> P:
  """PartitionSpec for one array; drops mesh axes that do not divide it."""
  table = dict(rules)
  used, out = set(), []
  for name, dim in zip(axes, shape):
    mesh_axes = table.get(name) if name is not None else None
    if mesh_axes is None:
      out.append(None)
      continue
    mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
    kept = []
    for ax in mesh_axes:
      size = mesh.shape.get(ax, 1)
      if ax in used or size == 1:
        continue
      if dim % (math.prod(mesh.shape[a] for a in kept) * size) == 0:
        kept.append(ax)
    used.update(kept)
    out.append(tuple(kept) if len(kept) > 1 else (kept[0] if kept else None))
  return P(*out)


def tree_shardings(logical_tree: Any, shapes_tree: Any, mesh: Mesh,
                   rules=DEFAULT_RULES) -> Any:
  """NamedShardings for a tree of logical PartitionSpecs and shapes."""
  return jax.tree.map(
      lambda axes, x: NamedSharding(
          mesh, logical_to_spec(tuple(axes), x.shape, mesh, rules)),
      logical_tree, shapes_tree,
      is_leaf=lambda x: isinstance(x, P))


def place(host_tree: Any, shardings: Any) -> Any:
  """Puts host (NumPy) arrays on the mesh; each device gets only its shard."""
  def put(x, s):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])
  return jax.tree.map(put, host_tree, shardings)


# The active (mesh, rules) for activation constraints inside model code: a
# context variable, so a thread tracing under one mesh (a generator beside
# the trainer) never sees another thread's (each thread starts with none).
_ACTIVE: contextvars.ContextVar[tuple[Mesh | None, Any]] = \
    contextvars.ContextVar("swirl_jax_active_mesh",
                           default=(None, DEFAULT_RULES))


def reuse_shards(x, s: NamedSharding):
  """`x` laid out by `s`. Where each of s's devices already holds in `x`
  the part `s` gives it (one data group's share of an array replicated
  over the groups, one host's of a global array), the result is made of
  those same buffers, with no copy; else a `device_put`."""
  if not isinstance(x, jax.Array):
    return jax.device_put(x, s)
  have = x.sharding.devices_indices_map(x.shape)
  want = s.devices_indices_map(x.shape)
  if any(have.get(d) != idx for d, idx in want.items()):
    return jax.device_put(x, s)
  mine = {shard.device: shard.data for shard in x.addressable_shards}
  return jax.make_array_from_single_device_arrays(
      x.shape, s, [mine[d] for d in s.mesh.devices.flat])


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None, rules=DEFAULT_RULES):
  """Activation constraints in model code apply while this is active (in
  this thread and context only; `jax.set_mesh` is thread-local too)."""
  token = _ACTIVE.set((mesh, rules))
  try:
    if mesh is None:
      yield
    else:
      with jax.set_mesh(mesh):
        yield
  finally:
    _ACTIVE.reset(token)


def active_mesh() -> Mesh | None:
  """The mesh of the innermost `use_mesh` (None outside one)."""
  return _ACTIVE.get()[0]


def active_rules():
  return _ACTIVE.get()[1]


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """`with_sharding_constraint` by logical axes; a no-op without a mesh."""
  mesh, rules = _ACTIVE.get()
  if mesh is None or mesh.size == 1:
    return x
  spec = logical_to_spec(axes, x.shape, mesh, rules)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def data_sharding(mesh: Mesh, ndim: int, rules=DEFAULT_RULES,
                  shape: Sequence[int] | None = None) -> NamedSharding:
  """Batch-major arrays: first axis over the batch axes, the rest whole."""
  axes = ("batch",) + (None,) * (ndim - 1)
  shape = shape if shape is not None else (
      math.prod(mesh.shape[a] for a in mesh.axis_names),) + (1,) * (ndim - 1)
  return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))
