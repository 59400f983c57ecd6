r"""Where a decode step's time goes: a `jax.profiler` trace of one decode
chunk on the sampler's page pool, summarised per step.

The model is a random-weight preset (bf16) whose rows hold `--context`
tokens of random cache contents (`accelerator._filled`); one chunk of
`--steps` decode steps is compiled and run, then run again inside the
trace. The summary counts, per decode step, from the trace's Perfetto
JSON:

  kernels      device events that are neither copies nor memsets (on a
               GPU its kernels; on a CPU, where there is no device
               timeline, XLA's ops on the host client's threads)
  d2h, h2d     device-to-host and host-to-device copies
  syncs        host calls that wait for the device (names with
               'Synchronize'): each is a host round trip
  kernel_ms    the kernels' summed duration, and their busy fraction of
               the step's wall time

with the kernels that take the most time. Nothing here is an estimate:
what the trace holds is counted and divided by `--steps`.

  python benchmarks/decode_profile.py [--model=qwen2_5_0_5b] [--rows=64]
      [--context=512] [--steps=16] [--out=profile.json] [--small]

On a CPU it runs the presets' 2-layer, small-vocabulary stand-ins (as
accelerator.py's --small). The last line printed is one JSON object.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import pathlib
import re
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # pylint: disable=g-import-not-at-top

from swirl_jax.models import presets

import accelerator  # pylint: disable=g-bad-import-order
import common  # pylint: disable=g-bad-import-order

_COPY = re.compile(r"memcpy|memset|copy(d2h|h2d|dtoh|htod)", re.I)
_D2H = re.compile(r"d2h|dtoh|devicetohost|device_to_host", re.I)
_H2D = re.compile(r"h2d|htod|hosttodevice|host_to_device", re.I)
_SYNC = re.compile(r"synchronize", re.I)


def _events(trace_dir: str) -> list[dict]:
  files = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                    recursive=True)
  if not files:
    raise RuntimeError(f"no perfetto_trace.json.gz under {trace_dir}")
  with gzip.open(max(files, key=os.path.getmtime)) as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def summarise(events: list[dict], steps: int, step_ms: float) -> dict:
  """Per-step counts of the trace's kernels, copies and host waits."""
  procs = {e["pid"]: e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  spans = [e for e in events if e.get("ph") == "X"]
  on_device = lambda e: procs.get(e["pid"], "").startswith("/device:")
  device = [e for e in spans if on_device(e)]
  if device:
    kernels = [e for e in device if not _COPY.search(e["name"])]
  else:  # A CPU: XLA's ops on the client's threads ('end: ' marks pairs).
    kernels = [e for e in spans if "PjRtCpuClient" in threads.get(
        (e["pid"], e.get("tid")), "") and not e["name"].startswith("end: ")
               and "::" not in e["name"]]  # Not the runtime's own spans.
  # A copy counted once: on the device's timeline where there is one (the
  # host's API call that started it is not counted again).
  copies = [e for e in device or spans if _COPY.search(e["name"])]
  by_name = collections.defaultdict(lambda: [0, 0.0])
  for e in kernels:
    by_name[e["name"]][0] += 1
    by_name[e["name"]][1] += e.get("dur", 0) / 1e3
  kernel_ms = sum(ms for _, ms in by_name.values()) / steps
  top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:15]
  per = lambda n: round(n / steps, 2)
  return dict(
      device_timeline=bool(device), processes=sorted(set(procs.values())),
      kernels_per_step=per(len(kernels)),
      d2h_per_step=per(sum(bool(_D2H.search(e["name"])) for e in copies)),
      h2d_per_step=per(sum(bool(_H2D.search(e["name"])) for e in copies)),
      copies_per_step=per(len(copies)),
      syncs_per_step=per(sum(bool(_SYNC.search(e["name"])) for e in spans)),
      kernel_ms_per_step=round(kernel_ms, 4),
      kernel_busy_fraction=round(kernel_ms / step_ms, 3) if step_ms else None,
      copy_names=collections.Counter(e["name"] for e in copies
                                     ).most_common(8),
      sync_names=collections.Counter(e["name"] for e in spans
                                     if _SYNC.search(e["name"])
                                     ).most_common(8),
      top_kernels=[dict(name=n[:120], per_step=per(c), ms_per_step=round(
          ms / steps, 4)) for n, (c, ms) in top])


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="qwen2_5_0_5b")
  common.int_flags(p, rows=64, context=512, steps=16)
  p.add_argument("--out", default="", help="also write the JSON here")
  p.add_argument("--trace_dir", default="",
                 help="keep the raw trace here (default: a temp folder)")
  p.add_argument("--small", action="store_true",
                 help="2-layer stand-ins (always on when the backend is a "
                      "CPU)")
  args = p.parse_args()
  small = args.small or jax.default_backend() == "cpu"
  over = dict(dtype="bfloat16", param_dtype="bfloat16")
  if small:
    over.update(accelerator.SMALL)
  cfg = presets.get_preset(args.model, **over)
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="decode_trace_")
  dec = accelerator.bench_decode(cfg, args.rows, args.context, args.steps,
                                 reps=1, fill=True, profile_dir=trace_dir)
  # The traced chunk is the last of two; its time is what was traced.
  step_ms = 1e3 * dec["last_s"] / args.steps
  dev = jax.devices()[0]
  out = dict(benchmark="decode_profile", backend=jax.default_backend(),
             device_kind=dev.device_kind, small=small, model=args.model,
             layers=cfg.num_layers,
             decode_shape=[args.rows, args.context, args.steps],
             traced_step_ms=round(step_ms, 3), trace_dir=trace_dir,
             **summarise(_events(trace_dir), args.steps, step_ms))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
