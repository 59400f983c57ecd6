"""The jitted train step: sharding parity, golden values, skips, accumulation,
LoRA and every loss kind, on the tiny model."""

import textwrap
import threading

import jax
import ml_collections
import numpy as np
import pytest

import fresh_process

from swirl_jax import sharding as shd
from swirl_jax.models import decoder
from swirl_jax.models import presets
from swirl_jax.training import lora
from swirl_jax.training import optimizer
from swirl_jax.training import state as state_lib
from swirl_jax.training import step as step_lib
from swirl_jax.training import trainer

B, T = 4, 16

# Step 1 loss / grad norm and step 2 loss of `test_golden_one_step`.
GOLDEN_LOSS_1 = -0.045017123222351074
GOLDEN_GRAD_NORM_1 = 1.0649889707565308
GOLDEN_LOSS_2 = 1.2502076625823975
# Step 1's other metrics there; 1 / 14 loss tokens clipped high.
GOLDEN_METRICS_1 = dict(clip_frac_low=0.0, clip_frac_high=0.0714285746216774,
                        dual_clip_frac=0.0, ratio_max=2.243659734725952,
                        ratio_mean=1.033046841621399,
                        approx_kl=0.05760502442717552)
# The LoRA, PPO and loss-kind tests' figures, printed once by running each
# test's setup (make_config, make_batch, host_params seed 0) and recorded;
# two runs gave the same bits.
GOLDEN_LORA = dict(grad_norm_1=0.4159908592700958, loss_2=1.248341679573059)
GOLDEN_PPO_LOSSES = (0.8625547885894775, 0.44935140013694763,
                     0.4751150608062744, 0.4080127775669098)
GOLDEN_KINDS = {
    "stepwise_pg": dict(loss=3.597560405731201, grad_norm=8.116323471069336,
                        kl=0.050581611692905426, entropy=5.531158924102783),
    "sft": dict(loss=5.562382221221924, grad_norm=2.687265157699585,
                entropy=5.531158924102783)}
GOLDEN_TOL = dict(rtol=2e-4, atol=1e-6)


def make_config(**kw) -> ml_collections.ConfigDict:
  c = trainer.default_config()
  c.optim.lr = 1e-3
  c.progress = False
  for k, v in kw.items():
    node, *rest = k.split("__")
    if rest:
      c[node][rest[0]] = v
    else:
      c[k] = v
  return c


def make_batch(seed=0, b=B, t=T):
  rng = np.random.default_rng(seed)
  mask = (rng.random((b, t)) > 0.3).astype(np.float32)
  mask[:, :4] = 0  # A prompt.
  mask[1, 8:] = 0  # Rows of different lengths weigh tokens unevenly.
  return dict(
      tokens=rng.integers(0, 256, (b, t)), loss_mask=mask,
      advantages=rng.normal(size=(b,)).astype(np.float32),
      behaviour_logprobs=rng.normal(-5.5, 0.3, (b, t)).astype(np.float32))


# Tests compile many steps; XLA's backend optimisations cost most of that
# time and matter nothing at this size.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def host_params(cfg, seed=0):
  """Random params made on the host (the jitted init compiles slowly)."""
  rng = np.random.default_rng(seed)
  def leaf(path, s):
    x = rng.normal(0.0, 0.02, s.shape)
    return (x + 1.0 if "scale" in jax.tree_util.keystr(path) else x).astype(
        s.dtype)
  return jax.tree_util.tree_map_with_path(leaf, decoder.abstract_params(cfg))


class Setup:
  """Model, mesh, optimizer and a host copy of the initial state."""

  def __init__(self, config):
    self.cfg = presets.get_preset("tiny")
    self.mesh = shd.make_mesh([("data", 1), ("fsdp", 1), ("tensor", 1)],
                              jax.devices()[:1])
    self.config = config
    lora_cfg = config.lora if config.lora.rank else None
    self.tx, self.schedule = optimizer.make_optimizer(config.optim, 10)
    state, self.shardings = state_lib.create(
        self.cfg, self.tx, self.mesh, seed=0, lora_cfg=lora_cfg,
        params=host_params(self.cfg))
    self.host_state = jax.device_get(state)
    self.step = step_lib.TrainStep(self.cfg, config, self.tx, self.schedule,
                                   self.mesh, self.shardings,
                                   compiler_options=FAST_COMPILE)

  def fresh_state(self):
    return jax.device_put(self.host_state, self.shardings)

  def run(self, batches):
    state, out = self.fresh_state(), []
    for batch in batches:
      state, metrics = self.step(state, batch)
      out.append({k: float(v) for k, v in metrics.items()})
    return state, out


@pytest.fixture(scope="module")
def base():
  return Setup(make_config())


def tree_equal(a, b):
  return all(jax.tree.leaves(jax.tree.map(
      lambda x, y: np.array_equal(np.asarray(x), np.asarray(y),
                                  equal_nan=True), a, b)))


def test_golden_one_step(base):
  _, (m1, m2) = base.run([make_batch(0), make_batch(1)])
  print(f"GOLDEN_LOSS_1 = {m1['loss']!r}\nGOLDEN_GRAD_NORM_1 = "
        f"{m1['grad_norm']!r}\nGOLDEN_LOSS_2 = {m2['loss']!r}")
  msg = ("if you intentionally changed init/loss/optimizer, update GOLDEN_* "
         "with the printed values")
  got = (m1["loss"], m1["grad_norm"], m2["loss"])
  want = (GOLDEN_LOSS_1, GOLDEN_GRAD_NORM_1, GOLDEN_LOSS_2)
  np.testing.assert_allclose(got, want, **GOLDEN_TOL, err_msg=msg)
  assert m1["num_loss_tokens"] == (make_batch(0)["loss_mask"][:, 1:]
                                   != 0).sum()
  assert m1["skipped"] == 0 and m1["lr"] == pytest.approx(1e-3)
  for k, v in GOLDEN_METRICS_1.items():
    np.testing.assert_allclose(m1[k], v, **GOLDEN_TOL, err_msg=k)


def test_non_finite_update_is_skipped(base):
  state = base.fresh_state()
  bad = make_batch(0)
  bad["advantages"][0] = np.nan
  new, metrics = base.step(state, bad)
  assert float(metrics["update_skipped"]) == 1
  assert int(new.skipped) == 1 and int(new.step) == 1
  assert tree_equal(jax.device_get(new.params), base.host_state.params)
  assert tree_equal(jax.device_get(new.opt_state), base.host_state.opt_state)
  # A -inf behaviour log-prob off the loss mask is harmless: applied.
  ok = make_batch(0)
  ok["behaviour_logprobs"][:, 0] = -np.inf  # Column 0 is prompt: off mask.
  new, metrics = base.step(new, ok)
  assert float(metrics["update_skipped"]) == 0 and int(new.skipped) == 1
  # The skipped step left the initial params: the clean batch's figures.
  np.testing.assert_allclose(float(metrics["loss"]), GOLDEN_LOSS_1,
                             **GOLDEN_TOL)


def test_gradient_accumulation_matches_full_batch(base):
  acc = Setup(make_config(micro_batches=2))
  batch = make_batch(0)
  s_full, (m_full,) = base.run([batch])
  s_acc, (m_acc,) = acc.run([batch])
  for k in ("loss", "grad_norm", "num_loss_tokens", "ratio_max",
            "clip_frac_low", "approx_kl"):
    np.testing.assert_allclose(m_acc[k], m_full[k], rtol=1e-5, atol=1e-7,
                               err_msg=k)
  # Adam divides by sqrt(v): on near-zero gradient entries, float noise in
  # the gradient (summation order) moves the update by a fraction of lr
  # (1e-3); a wrong accumulation would move it by about lr.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4),
               jax.device_get(s_acc.params), jax.device_get(s_full.params))


def test_lora_trains_adapters_only():
  config = make_config(lora__rank=4, lora__targets=("q", "v", "down"))
  setup = Setup(config)
  host = setup.host_state
  assert set(host.params) == {"q", "v", "down"}
  assert host.params["q"]["a"].shape == (2, 64, 4)
  assert host.params["q"]["b"].shape == (2, 4, 4, 16)
  state, (m1, m2) = setup.run([make_batch(0), make_batch(1)])
  np.testing.assert_allclose((m1["grad_norm"], m2["loss"]),
                             (GOLDEN_LORA["grad_norm_1"],
                              GOLDEN_LORA["loss_2"]), **GOLDEN_TOL)
  assert tree_equal(jax.device_get(state.frozen), host.frozen)
  for name in ("q", "v", "down"):
    for ab in ("a", "b"):
      assert not np.array_equal(np.asarray(state.params[name][ab]),
                                host.params[name][ab]), (name, ab)
  # Only adapters carry optimizer moments.
  mu = state.opt_state[0].mu
  assert jax.tree.structure(mu) == jax.tree.structure(host.params)


def test_ppo_epochs_and_mini_batches(base):
  rollout = {k: np.concatenate([a, b]) for (k, a), b in
             zip(make_batch(0).items(), make_batch(1).values())}
  state, metrics = step_lib.ppo_update(base.step, base.fresh_state(), rollout,
                                       epochs=2, mini_batch_size=B)
  assert len(metrics) == 4 and int(state.step) == 4
  assert base.step.jitted(B)._cache_size() == 1  # Same shapes: no retrace.
  np.testing.assert_allclose([float(m["loss"]) for m in metrics],
                             GOLDEN_PPO_LOSSES, **GOLDEN_TOL)


@pytest.mark.parametrize("kind", ["stepwise_pg", "sft"])
def test_each_loss_kind_runs(kind):
  setup = Setup(make_config(loss__kind=kind, loss__with_entropy=True,
                            loss__kl_coef=0.1))
  batch = make_batch(0)
  if kind == "sft":
    del batch["advantages"], batch["behaviour_logprobs"]
  else:  # With a reference model: the KL term.
    batch["ref_logprobs"] = batch.pop("behaviour_logprobs")
  _, (m,) = setup.run([batch])
  for k, v in GOLDEN_KINDS[kind].items():
    np.testing.assert_allclose(m[k], v, **GOLDEN_TOL, err_msg=k)
  if kind == "stepwise_pg":
    assert m["loss"] == pytest.approx(
        m["pg_loss"] + 0.1 * m["kl_loss"], rel=1e-5)
  assert 0 < m["entropy"] <= np.log(256) + 1e-3
  if kind == "sft":  # Near-uniform at init: NLL ~ log V.
    assert m["loss"] == pytest.approx(np.log(256), rel=0.05)


# (LoRA rank, attention_impl, mesh) of each sharded run, checked against
# the run of that rank on one device with the block attention. Splash is left out: at the 128 tokens it
# needs, Pallas' interpreter makes a train step take minutes on a CPU;
# test_attention_impl.py checks it on a mesh (values and gradients).
MESH_CASES = [
    (0, "xla_blocks", [("data", 1), ("fsdp", 4), ("tensor", 2)]),
    (4, "xla_blocks", [("data", 2), ("fsdp", 2), ("tensor", 2)]),
    (0, "dot_product", [("data", 2), ("fsdp", 2), ("tensor", 2)]),
    (4, "dot_product", [("data", 4), ("fsdp", 1), ("tensor", 2)]),
]

_MESH_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import json, sys
    import jax, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    sys.path.insert(0, "tests")
    from swirl_jax import sharding as shd
    from swirl_jax.training import optimizer, state as state_lib
    from swirl_jax.training import step as step_lib
    from test_train_step import FAST_COMPILE, MESH_CASES, host_params
    from test_train_step import make_batch, make_config
    from swirl_jax.models import presets

    params = host_params(presets.get_preset("tiny"))

    def run(rank, impl, spec, devs):
      cfg = presets.get_preset("tiny", attention_impl=impl)
      config = make_config(micro_batches=2, lora__rank=rank)
      tx, sched = optimizer.make_optimizer(config.optim, 10)
      mesh = shd.make_mesh(spec, devs)
      state, shardings = state_lib.create(
          cfg, tx, mesh, seed=0, params=params,
          lora_cfg=config.lora if rank else None)
      step = step_lib.TrainStep(cfg, config, tx, sched, mesh, shardings,
                                compiler_options=FAST_COMPILE)
      losses = []
      for i in range(2):
        state, m = step(state, make_batch(i, b=8))
        losses.append([float(m["loss"]), float(m["grad_norm"])])
      q = (state.params["q"]["b"] if rank
           else state.params["layers"]["attn"]["q"])
      return dict(
          losses=losses, cache=step.jitted(8)._cache_size(),
          spec=str(q.sharding.spec), n_shards=len(q.addressable_shards),
          params=[np.asarray(x).tolist() for x in
                  jax.tree.leaves(jax.device_get(state.params))])

    one = [("data", 1), ("fsdp", 1), ("tensor", 1)]
    out = dict(one={r: run(r, "xla_blocks", one, jax.devices()[:1])
                    for r in {c[0] for c in MESH_CASES}},
               mesh=[run(*case, jax.devices()) for case in MESH_CASES])
    print(json.dumps(out))
    """)


def test_sharded_step_matches_single_device():
  """Data, FSDP and tensor meshes, with and without LoRA, with each
  attention implementation that runs on a CPU (MESH_CASES)."""
  out = fresh_process.last_json(_MESH_SCRIPT)
  for case, mesh in zip(MESH_CASES, out["mesh"], strict=True):
    rank = case[0]
    one = out["one"][str(rank)]
    assert mesh["n_shards"] == 8, case
    axis = "tensor" if rank else "fsdp"  # q's b: [L, r | heads, head_dim].
    assert axis in mesh["spec"], (case, mesh["spec"])
    assert one["cache"] == 1 and mesh["cache"] == 1  # Two steps, one compile.
    np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=1e-5,
                               err_msg=str(case))
    for a, b in zip(mesh["params"], one["params"], strict=True):  # Adam.
      np.testing.assert_allclose(a, b, atol=2e-5, err_msg=str(case))


_BORN_ON_MESH_SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, ml_collections
    from swirl_jax.training import trainer as trainer_lib
    c = trainer_lib.default_config()
    c.mesh = "[('fsdp', -1)]"
    c.progress = c.tensorboard = False
    block = ml_collections.ConfigDict(dict(
        preset="smollm2_135m", checkpoint="bundled", tokenizer="",
        dtype="float32", param_dtype="float32", remat="none"))
    dev0 = jax.devices()[0]
    def on_dev0(arrays):
      return sum(s.data.nbytes for x in arrays for s in x.addressable_shards
                 if s.device == dev0)
    mesh, (cfg, params, tok) = trainer_lib.load_policy(c, block)
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    loaded = on_dev0(jax.tree.leaves(params))
    trainer = trainer_lib.Trainer(c, tempfile.mkdtemp(), cfg, params=params,
                                  mesh=mesh)
    same = jax.tree.map(lambda a, b: a.sharding == b, params,
                        trainer.shardings.params)
    del params
    print(json.dumps(dict(
        total=total, loaded_dev0=loaded, live_dev0=on_dev0(jax.live_arrays()),
        same_shardings=all(jax.tree.leaves(same)),
        mesh=dict(trainer.mesh.shape))))
""")


def test_policy_is_loaded_into_the_trainers_shardings():
  """The weights go from the checkpoint straight into their FSDP shards:
  device 0 holds about an eighth of them, and after the trainer is built
  (params, Adam's two moments) no whole copy sits anywhere."""
  out = fresh_process.last_json(_BORN_ON_MESH_SCRIPT)
  assert out["mesh"] == {"fsdp": 8}
  assert out["same_shardings"]
  assert out["loaded_dev0"] < 0.15 * out["total"]  # Whole copy: 1.0.
  # Params + two moments, each sharded 8 ways: ~3/8 of one copy.
  assert out["live_dev0"] < 0.5 * out["total"]


def test_policy_params_merge_compiles_once(tmp_path):
  config = make_config(lora__rank=4, lora__targets=("q", "v"),
                       checkpoint_every=1000, tensorboard=False)
  cfg = presets.get_preset("tiny")
  t = trainer.Trainer(config, str(tmp_path), cfg, params=host_params(cfg))
  merged = [t.policy_params()]
  size = lora._merge._cache_size()  # pylint: disable=protected-access
  merged += [t.policy_params() for _ in range(2)]
  assert lora._merge._cache_size() == size  # pylint: disable=protected-access
  want = jax.device_get(t.state.frozen)["layers"]["attn"]["q"]
  np.testing.assert_allclose(merged[-1]["layers"]["attn"]["q"], want)
  t.close(save=False)


def test_sampling_params_are_a_compute_dtype_copy(tmp_path):
  """fp32 master weights, bf16 compute: the sampler reads a bf16 copy laid
  out as the params (one program, compiled once); with fp32 compute it
  reads the trainer's own arrays."""
  config = make_config(checkpoint_every=1000, tensorboard=False)
  cfg = presets.get_preset("tiny", dtype="bfloat16", param_dtype="float32")
  t = trainer.Trainer(config, str(tmp_path / "bf16"), cfg,
                      params=host_params(cfg))
  copies = [t.sampling_params()]
  size = trainer._cast_floats._cache_size()  # pylint: disable=protected-access
  copies.append(t.sampling_params())
  assert trainer._cast_floats._cache_size() == size  # pylint: disable=protected-access
  master = t.policy_params()
  for got, want in zip(jax.tree.leaves(copies[-1]), jax.tree.leaves(master)):
    assert got.dtype == jax.numpy.bfloat16 and want.dtype == np.float32
    assert got.sharding.is_equivalent_to(want.sharding, got.ndim)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(
        jax.numpy.asarray(want).astype(jax.numpy.bfloat16), np.float32))
  t.close(save=False)
  cfg32 = presets.get_preset("tiny")
  t = trainer.Trainer(config, str(tmp_path / "fp32"), cfg32,
                      params=host_params(cfg32))
  assert all(a is b for a, b in zip(jax.tree.leaves(t.sampling_params()),
                                    jax.tree.leaves(t.policy_params())))
  t.close(save=False)


def test_active_mesh_is_per_thread():
  """A mesh one thread activates (`use_mesh`) is not another thread's (a
  rollout generator traces beside the trainer), and is gone after."""
  mesh = shd.make_mesh([("data", -1)])
  entered, seen, done = threading.Event(), {}, threading.Event()

  def other():
    entered.wait()
    seen["mesh"], seen["rules"] = shd.active_mesh(), shd.active_rules()
    done.set()

  t = threading.Thread(target=other)
  t.start()
  with shd.use_mesh(mesh, rules=(("batch", "data"),)):
    entered.set()
    done.wait()
    assert shd.active_mesh() is mesh
  t.join()
  assert seen == {"mesh": None, "rules": shd.DEFAULT_RULES}
  assert shd.active_mesh() is None
