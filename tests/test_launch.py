"""launch/: the TPU VM and SLURM launchers print and run the right commands.

gcloud, sbatch and srun are fakes on PATH that record their arguments, so
nothing here touches a network or a cluster.
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest

import testutil

REPO = pathlib.Path(__file__).resolve().parent.parent
LAUNCH = REPO / "launch"
TPU = "tpu_vm.sh"
GPU = "gpu_slurm.sh"

# Environment variables the scripts take defaults from; a test sets its own.
_SCRIPT_ENV = (
    "TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE", "RUNTIME_VERSION",
    "REPO_URL", "REPO_REF", "REMOTE_DIR", "VENV", "CONFIG", "WORKDIR",
    "COORDINATOR", "DRY_RUN", "NODES", "GPUS_PER_NODE", "PARTITION",
    "TIME_LIMIT", "COORDINATOR_PORT")

_FAKE = """#!{python}
import json, os, sys, tarfile
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
record = {{"prog": name, "args": args,
          "env": {{k: os.environ.get(k) for k in (
              "JAX_LOCAL_DEVICE_IDS", "HF_HOME", "JAX_COORDINATOR_ADDRESS",
              "JAX_NUM_PROCESSES")}}}}
if name == "gcloud" and "scp" in args:
  tgz = next(a for a in args if a.endswith(".tgz"))
  record["files"] = sorted(tarfile.open(tgz).getnames())
with open(os.environ["FAKE_CALLS"], "a") as f:
  f.write(json.dumps(record) + "\\n")
if name == "gcloud" and "describe" in args:
  print("10.0.0.2")
if name == "sbatch":
  print("Submitted batch job 42")
if name == "scontrol":  # show hostnames NODELIST
  # One write, as scontrol makes: the job script reads it through
  # `head -n 1`, and a second write (PYTHONUNBUFFERED) can meet a closed pipe.
  sys.stdout.write("gpu-node-7\\ngpu-node-8\\n")
"""

TPU_BASE = ("--name=swirl", "--zone=us-central2-b")
RUN_ARGS = (*TPU_BASE, "--config=configs/swirl_gsm8k.py:model=qwen2_5_7b",
            "--workdir=/mnt/runs/gsm8k", "--env", "SWIRL_JAX_DATA=/data",
            "--", "--config.prompt=What's 2+2?")
PROMPT = "--config.prompt=What's 2+2?"


class Fakes:
  """Fake gcloud, sbatch and srun on PATH, and the calls they recorded."""

  def __init__(self, root: pathlib.Path):
    self.bin = root / "bin"
    self.bin.mkdir()
    self.calls_path = root / "calls.jsonl"
    text = _FAKE.format(python=sys.executable)
    for name in ("gcloud", "sbatch", "srun", "scontrol"):
      path = self.bin / name
      path.write_text(text)
      path.chmod(0o755)

  def calls(self):
    if not self.calls_path.exists():
      return []
    return testutil.read_jsonl(self.calls_path)

  def run(self, script, *args, env=None, cwd=None):
    full_env = {k: v for k, v in os.environ.items() if k not in _SCRIPT_ENV}
    full_env["PATH"] = f"{self.bin}{os.pathsep}{full_env['PATH']}"
    full_env["FAKE_CALLS"] = str(self.calls_path)
    full_env.update(env or {})
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args], capture_output=True,
        text=True, env=full_env, cwd=cwd or self.bin.parent, timeout=60)


@pytest.fixture
def fakes(tmp_path):
  return Fakes(tmp_path)


def _commands(text):
  """The '+ ' lines of a run, each split into words as a shell would."""
  return [shlex.split(l[2:]) for l in text.splitlines() if l.startswith("+ ")]


def _remote(argv):
  """The shell text of a `gcloud ... ssh --command=...`."""
  (command,) = [a[len("--command="):] for a in argv
                if a.startswith("--command=")]
  return command


def _ok(result):
  assert result.returncode == 0, result.stderr
  return result


def _assert_bad_usage(fakes, script, argv, error):
  """Fails with one line naming `error`, having run nothing."""
  r = fakes.run(script, *argv)
  assert r.returncode != 0
  assert r.stderr.splitlines() == [r.stderr.splitlines()[0]]
  assert error in r.stderr
  assert not fakes.calls()


def _assert_shell_syntax(text):
  subprocess.run(["bash", "-n", "-c", text], check=True)


def test_scripts_are_executable_bash():
  for name in (TPU, GPU):
    path = LAUNCH / name
    assert os.access(path, os.X_OK), name
    subprocess.run(["bash", "-n", str(path)], check=True)


# TPU VMs.


def test_tpu_create_dry_run(fakes):
  r = _ok(fakes.run(TPU, "create", "--dry-run", *TPU_BASE, "--type=v4-32"))
  assert _commands(r.stdout) == [[
      "gcloud", "compute", "tpus", "tpu-vm", "create", "swirl",
      "--zone=us-central2-b", "--accelerator-type=v4-32",
      "--version=tpu-ubuntu2204-base"]]
  assert not fakes.calls()


def test_tpu_run_dry_run_runs_main_on_every_host(fakes):
  r = _ok(fakes.run(TPU, "run", "--dry-run", *RUN_ARGS))
  describe, ssh = _commands(r.stdout)
  assert describe[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "describe",
                          "swirl"]
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "swirl"]
  assert "--worker=all" in ssh and "--zone=us-central2-b" in ssh
  remote = _remote(ssh)
  _assert_shell_syntax(remote)
  words = shlex.split(remote)
  main_at = words.index("swirl_jax.main")
  assert words[main_at - 2:] == [
      "~/swirl_venv/bin/python", "-m", "swirl_jax.main",
      "--config=configs/swirl_gsm8k.py:model=qwen2_5_7b",
      "--workdir=/mnt/runs/gsm8k", PROMPT]
  assert "JAX_COORDINATOR_ADDRESS=WORKER_0_IP:8476" in words
  assert "SWIRL_JAX_DATA=/data" in words
  assert not fakes.calls()


def test_tpu_run_mounts_a_gs_workdir_on_every_host(fakes):
  """A gs:// workdir: each host mounts the bucket (installing gcsfuse if
  missing) and main runs in the mount, every host in the same directory."""
  args = [a if not a.startswith("--workdir=") else
          "--workdir=gs://my-bucket/runs/gsm8k" for a in RUN_ARGS]
  r = _ok(fakes.run(TPU, "run", "--dry-run", *args))
  _, ssh = _commands(r.stdout)
  remote = _remote(ssh)
  _assert_shell_syntax(remote)
  mount, run = remote.split(" && cd ~/swirl_jax && ")
  assert mount.startswith("{ command -v gcsfuse >/dev/null || {")
  assert "apt-get -qq install -y gcsfuse" in mount
  assert mount.endswith("mkdir -p ~/gcs/my-bucket && { mountpoint -q "
                        "~/gcs/my-bucket || gcsfuse --implicit-dirs my-bucket "
                        "~/gcs/my-bucket; }")
  words = shlex.split(run)
  assert "--workdir=$HOME/gcs/my-bucket/runs/gsm8k" in words
  assert words[-1] == PROMPT


def test_tpu_dry_run_env_var_same_as_flag(fakes):
  flag = _ok(fakes.run(TPU, "run", "--dry-run", *RUN_ARGS))
  env = _ok(fakes.run(TPU, "run", *RUN_ARGS, env={"DRY_RUN": "1"}))
  assert env.stdout == flag.stdout
  assert not fakes.calls()


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_dry_run_env_values(fakes, tmp_path, value):
  _ok(fakes.run(TPU, "delete", *TPU_BASE, env={"DRY_RUN": value}))
  _ok(fakes.run(GPU, "submit", "--config=configs/swirl_gsm8k.py",
                f"--workdir={tmp_path / 'w'}", env={"DRY_RUN": value}))
  assert not fakes.calls()
  assert not (tmp_path / "w").exists()


def test_tpu_options_from_environment(fakes):
  r = _ok(fakes.run(TPU, "delete", "-n", env={
      "TPU_NAME": "envtpu", "ZONE": "europe-west4-a", "PROJECT": "proj"}))
  assert _commands(r.stdout) == [[
      "gcloud", "compute", "tpus", "tpu-vm", "delete", "envtpu",
      "--zone=europe-west4-a", "--project=proj"]]


def test_tpu_install_dry_run_copies_checkout(fakes):
  r = _ok(fakes.run(TPU, "install", "--dry-run", *TPU_BASE))
  tar, scp, ssh = r.stdout.splitlines()
  assert tar.startswith("+ git -C ") and " | tar -czf " in tar
  scp, ssh = shlex.split(scp[2:]), shlex.split(ssh[2:])
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[6] == "swirl:swirl_jax_src.tgz" and "--worker=all" in scp
  assert not pathlib.Path(scp[5]).exists()  # Dry run: no tarball made.
  assert "--worker=all" in ssh
  remote = _remote(ssh)
  _assert_shell_syntax(remote)
  assert ("apt-get -qq -o DPkg::Lock::Timeout=600 install -y git python3-venv"
          " bubblewrap;" in remote)
  assert "pip install -q -U 'jax[tpu]';" in remote
  assert "tar -xzf ~/swirl_jax_src.tgz -C ~/swirl_jax" in remote
  assert remote.endswith("~/swirl_venv/bin/pip install -q -e ~/swirl_jax")
  assert not fakes.calls()


def test_tpu_install_dry_run_from_repo(fakes):
  url = "https://github.com/example/swirl_jax.git"
  r = _ok(fakes.run(TPU, "install", "-n", *TPU_BASE, f"--repo={url}",
                    "--ref=v1"))
  (ssh,) = _commands(r.stdout)  # No copy of the local checkout.
  remote = _remote(ssh)
  _assert_shell_syntax(remote)
  assert f"git clone -q {url} ~/swirl_jax" in remote
  assert "fetch -q origin v1" in remote
  assert not fakes.calls()


@pytest.mark.parametrize("argv", [
    ("create", *TPU_BASE, "--type=v5litepod-16", "--spot"),
    ("run", *RUN_ARGS),
    ("run", *RUN_ARGS[:4], "--detach", "--coordinator=10.9.9.9:1234"),
    ("ssh", *TPU_BASE, "--worker=all", "--", "tail", "~/swirl_run.log"),
    ("delete", *TPU_BASE, "--yes"),
], ids=["create", "run", "run_detach", "ssh", "delete"])
def test_tpu_runs_what_dry_run_prints(fakes, argv):
  dry = _ok(fakes.run(TPU, argv[0], "--dry-run", *argv[1:]))
  assert not fakes.calls()
  real = _ok(fakes.run(TPU, *argv))
  printed = _commands(dry.stdout.replace("WORKER_0_IP", "10.0.0.2"))
  assert [[c["prog"], *c["args"]] for c in fakes.calls()] == printed
  assert _commands(real.stderr) == printed  # Traced, too.


def test_tpu_run_uses_worker0_ip_as_coordinator(fakes):
  _ok(fakes.run(TPU, "run", *RUN_ARGS))
  describe, ssh = fakes.calls()
  assert "--format=value(networkEndpoints[0].ipAddress)" in describe["args"]
  assert ("JAX_COORDINATOR_ADDRESS=10.0.0.2:8476"
          in shlex.split(_remote(ssh["args"])))


@pytest.mark.skipif(not shutil.which("git"), reason="needs git")
def test_tpu_install_sends_code_without_ignored_files(fakes, tmp_path):
  src = tmp_path / "src"
  (src / "configs").mkdir(parents=True)
  (src / "runs").mkdir()
  (src / "setup.py").write_text("")
  (src / "configs" / "a.py").write_text("")
  (src / "runs" / "big.bin").write_text("x")
  (src / ".gitignore").write_text("/runs/\n")
  subprocess.run(["git", "init", "-q", str(src)], check=True)
  subprocess.run(["git", "-C", str(src), "add", "setup.py"], check=True)
  _ok(fakes.run(TPU, "install", *TPU_BASE, f"--src={src}"))
  scp, ssh = fakes.calls()
  assert scp["files"] == [".gitignore", "configs/a.py", "setup.py"]
  assert not pathlib.Path(scp["args"][4]).exists()  # Tarball cleaned up.
  assert "tar -xzf ~/swirl_jax_src.tgz -C ~/swirl_jax" in _remote(ssh["args"])


def test_tpu_help(fakes):
  r = _ok(fakes.run(TPU, "-h"))
  assert r.stdout.startswith("usage: launch/tpu_vm.sh")


@pytest.mark.parametrize("argv, error", [
    (("bogus",), "error: unknown command 'bogus'"),
    (("run", "--name=t"), "error: missing --zone"),
    (("create", *TPU_BASE), "error: missing --type"),
    (("create", *TPU_BASE, "--type=v99-8"), "pass --version"),
    (("run", *TPU_BASE, "--config=configs/a.py"), "error: missing --workdir"),
    (("run", *TPU_BASE, "--config=c.py", "--workdir=s3://b/r"),
     "only gs:// URLs are mounted"),
    (("run", *TPU_BASE, "--config=c.py", "--workdir=gs://Bad_Name/r"),
     "not a bucket name"),
    (("run", *TPU_BASE, "--frobnicate=1"), "unknown option --frobnicate"),
    (("run", "--name"), "error: option --name needs a value"),
    (("run", *TPU_BASE, "stray"), "error: unexpected argument 'stray'"),
    (("create", *TPU_BASE, "--type=v4-8", "--", "-n"), "for run and ssh only"),
    (("run", *TPU_BASE, "--env", "NOEQUALS"), "KEY=VALUE"),
])
def test_tpu_bad_usage(fakes, argv, error):
  _assert_bad_usage(fakes, TPU, argv, error)


def test_no_arguments_prints_usage_and_fails(fakes):
  for script in (TPU, GPU):
    r = fakes.run(script)
    assert r.returncode != 0
    assert r.stderr.startswith(f"usage: launch/{script}")


def test_coordinator_env_makes_main_go_multiprocess():
  """The variables the launchers rely on are the ones main.py's
  `distributed.initialize()` checks."""
  code = ("from swirl_jax import distributed; "
          "print(distributed.is_multiprocess())")
  drop = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "SLURM_NTASKS",
          "TPU_WORKER_HOSTNAMES")
  base = {k: v for k, v in os.environ.items() if k not in drop}
  for extra, want in [({}, "False"),
                      ({"JAX_COORDINATOR_ADDRESS": "10.0.0.2:8476"}, "True"),
                      ({"SLURM_NTASKS": "2"}, "True")]:
    out = subprocess.run([sys.executable, "-c", code], env={**base, **extra},
                         capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == want, extra


# SLURM.

GPU_ARGS = ("--nodes=2", "--gpus-per-node=4", "--partition=gpu",
            "--time=04:00:00", "--config=configs/swirl_gsm8k.py",
            "--env", "HF_HOME=/scratch/hf cache", "--", PROMPT)


_PER_TASK = 'export JAX_PROCESS_ID=$SLURM_PROCID; exec "$@"'
_SRUN = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash", "-c",
         _PER_TASK, "swirl_jax"]


def _srun_words(script):
  script = script.replace("\\\n", "")  # Continued lines.
  (line,) = [l for l in script.splitlines() if l.startswith("srun ")]
  return shlex.split(line)


def test_gpu_submit_dry_run(fakes, tmp_path):
  workdir = tmp_path / "runs" / "gsm8k"
  venv = tmp_path / "venv"
  r = _ok(fakes.run(GPU, "submit", "--dry-run", *GPU_ARGS[:-2],
                    f"--workdir={workdir}", f"--venv={venv}", *GPU_ARGS[-2:]))
  lines = r.stdout.splitlines()
  assert lines[0] == "#!/bin/bash"
  for want in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4",
               "--partition=gpu", "--time=04:00:00",
               f"--output={workdir}/slurm-%j.out"):
    assert f"#SBATCH {want}" in lines
  assert "export JAX_LOCAL_DEVICE_IDS=0,1,2,3" in lines
  assert 'export JAX_COORDINATOR_ADDRESS="$first_node:8476"' in lines
  assert "export JAX_NUM_PROCESSES=$SLURM_NNODES" in lines
  assert _srun_words(r.stdout) == [
      *_SRUN, f"{venv}/bin/python", "-m", "swirl_jax.main",
      "--config=configs/swirl_gsm8k.py", f"--workdir={workdir}", PROMPT]
  assert _commands(r.stdout) == [["mkdir", "-p", str(workdir)],
                                 ["sbatch", f"{workdir}/swirl_jax.sbatch"]]
  assert not fakes.calls()
  assert not workdir.exists()


def test_gpu_relative_workdir_is_made_absolute(fakes, tmp_path):
  r = _ok(fakes.run(GPU, "script", "--config=configs/swirl_gsm8k.py",
                    "--workdir=runs/x", cwd=tmp_path))
  assert f"--workdir={tmp_path}/runs/x" in _srun_words(r.stdout)
  assert "#SBATCH --nodes=1" in r.stdout.splitlines()


def test_gpu_job_script_runs_srun_with_the_arguments(fakes, tmp_path):
  """The job as sbatch would run it: the coordinator is the first node of
  the job's list, the process count its node count, and each task's id its
  SLURM_PROCID."""
  workdir = tmp_path / "w"
  r = _ok(fakes.run(GPU, "script", *GPU_ARGS[:-2], f"--workdir={workdir}",
                    "--venv=/opt/venv", "--port=9123", *GPU_ARGS[-2:]))
  job = tmp_path / "job.sh"
  job.write_text(r.stdout)
  env = {**os.environ, "PATH": f"{fakes.bin}{os.pathsep}{os.environ['PATH']}",
         "FAKE_CALLS": str(fakes.calls_path)}
  _ok(subprocess.run(
      ["bash", str(job)], capture_output=True, text=True, timeout=60,
      env={**env, "SLURM_JOB_NODELIST": "gpu-node-[7-8]", "SLURM_NNODES": "2"}))
  scontrol, srun = fakes.calls()
  assert scontrol["args"] == ["show", "hostnames", "gpu-node-[7-8]"]
  assert srun["prog"] == "srun"
  assert srun["args"] == [
      *_SRUN[1:], "/opt/venv/bin/python",
      "-m", "swirl_jax.main", "--config=configs/swirl_gsm8k.py",
      f"--workdir={workdir}", PROMPT]
  assert srun["env"] == {"JAX_LOCAL_DEVICE_IDS": "0,1,2,3",
                         "HF_HOME": "/scratch/hf cache",
                         "JAX_COORDINATOR_ADDRESS": "gpu-node-7:9123",
                         "JAX_NUM_PROCESSES": "2"}
  # What srun runs in task 1: main with JAX_PROCESS_ID=1.
  per_task = srun["args"][2:6] + ["sh", "-c", "echo $JAX_PROCESS_ID"]
  task = subprocess.run(per_task, env={**env, "SLURM_PROCID": "1"},
                        capture_output=True, text=True, check=True)
  assert task.stdout == "1\n"
  # Outside a SLURM job the script stops before srun.
  outside = subprocess.run(["bash", str(job)], capture_output=True,
                           text=True, timeout=60,
                           env={k: v for k, v in env.items()
                                if not k.startswith("SLURM_")})
  assert outside.returncode != 0 and "submit this script with sbatch" in \
      outside.stderr


def _fake_venv(root):
  python = root / "bin" / "python"
  python.parent.mkdir(parents=True)
  python.write_text("#!/bin/sh\n")
  python.chmod(0o755)
  return root


def test_gpu_submit_writes_and_submits_the_script(fakes, tmp_path):
  workdir = tmp_path / "w"
  venv = _fake_venv(tmp_path / "venv")
  args = (*GPU_ARGS[:-2], f"--workdir={workdir}", f"--venv={venv}",
          *GPU_ARGS[-2:])
  script = _ok(fakes.run(GPU, "script", *args)).stdout
  r = _ok(fakes.run(GPU, "submit", *args))
  job = workdir / "swirl_jax.sbatch"
  assert [[c["prog"], *c["args"]] for c in fakes.calls()] == [
      ["sbatch", str(job)]]
  assert job.read_text() == script
  assert "Submitted batch job 42" in r.stdout


def test_gpu_install_dry_run(fakes, tmp_path):
  venv = tmp_path / "venv"
  r = _ok(fakes.run(GPU, "install", "-n", f"--venv={venv}"))
  assert _commands(r.stdout) == [
      ["python3", "-m", "venv", str(venv)],
      [f"{venv}/bin/pip", "install", "-q", "-U", "pip"],
      [f"{venv}/bin/pip", "install", "-q", "-U", "jax[cuda12]"],
      [f"{venv}/bin/pip", "install", "-q", "-e", str(REPO)]]
  assert not venv.exists()


@pytest.mark.parametrize("argv, error", [
    (("bogus",), "error: unknown command 'bogus'"),
    (("submit", "--workdir=/w"), "error: missing --config"),
    (("submit", "--config=configs/swirl_gsm8k.py"), "error: missing --workdir"),
    (("script", "--config=configs/nope.py", "--workdir=/w"), "no config"),
    (("submit", "--config=configs/swirl_gsm8k.py", "--workdir=/w",
      "--nodes=two"), "--nodes wants a positive integer"),
    (("script", "--config=configs/swirl_gsm8k.py", "--workdir=/w",
      "--port=0"), "--port wants a positive integer"),
    (("submit", "--gpus=8"), "error: unknown option --gpus"),
    (("install", "--", "x"), "for script and submit only"),
    (("submit", "--config=configs/swirl_gsm8k.py", "--workdir=/w",
      "--venv=/nonexistent/venv"), "launch/gpu_slurm.sh install"),
])
def test_gpu_bad_usage(fakes, argv, error):
  _assert_bad_usage(fakes, GPU, argv, error)
