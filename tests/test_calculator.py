"""Calculator: results, formatting, refusals, and the killable workers."""

import time

import pytest

from swirl_jax.tools import calculator
from swirl_jax.tools import workers


@pytest.mark.parametrize("query,result", [
    ("12*7", "84"),
    ("10/4", "2.5"),
    ("1/3", "1/3 ≈ 0.3333333333"),
    ("2^10", "1024"),
    ("3(4+5)", "27"),
    ("1,000 * 3", "3000"),
    ("20% * 50", "10"),
    ("7 % 3", "1"),
    ("5!", "120"),
    ("0.1*3", "0.3"),
    ("2.5*4", "10"),
    ("-3^2", "-9"),
    ("sqrt(16)", "4"),
    ("sqrt(2)", "sqrt(2) ≈ 1.414213562"),
    ("round(2.567, 2)", "2.57"),
    ("12*7 =", "84"),
    ("$3.50 * 4", "14"),
    ("x + x", "2*x"),
    ("log(100, 10)", "2"),
])
def test_evaluate(query, result):
  assert calculator.evaluate(query) == result


@pytest.mark.parametrize("query,error", [
    ("__import__('os').system('ls')", "not allowed"),
    ("().__class__", "not allowed"),
    ("open('f')", "not allowed"),
    ("lambda: 1", "not allowed"),
    ("x[0]", "not allowed"),
    ("solve(x)", "not allowed"),
    ("9**9**9", "power too large"),
    ("2**2**2**2**2**2", "power too large"),
    ("factorial(10**6)", "factorial"),
    ("1/0", "division by zero"),
    ("1" * 300, "longer than"),
    ("", "empty"),
    ("3 +* ", "cannot parse"),
])
def test_evaluate_refuses(query, error):
  with pytest.raises(calculator.CalculatorError, match=error):
    calculator.evaluate(query)


def test_observation_format():
  assert calculator.format_observation("12*7", "84") == "12*7 -> 84"
  assert (calculator.format_observation("1/0", error="division by zero")
          == "1/0 -> Error: division by zero")


@pytest.fixture(scope="module")
def calc():
  with calculator.Calculator(num_workers=2, timeout_s=10.0) as c:
    yield c


def test_calculator_call_and_batch(calc):
  assert calc("12*7") == "12*7 -> 84"
  out = calc.batch(["1+1", "10/4", "9**9**9", "", "x" * 300, "2*(3"])
  assert out[:2] == ["1+1 -> 2", "10/4 -> 2.5"]
  assert out[2] == "9**9**9 -> Error: power too large"
  assert out[3] == " -> Error: empty expression"
  assert "Error: expression longer than" in out[4]
  assert out[5].startswith("2*(3 -> Error:")


def test_worker_pool_kills_overrunning_calls():
  with workers.WorkerPool(time.sleep, num_workers=1, timeout_s=0.5) as pool:
    start = time.time()
    ok, msg = pool.run(30)
    assert not ok and "timed out" in msg
    assert time.time() - start < 10
    # The killed worker is replaced: the pool still works.
    assert pool.run(0) == (True, None)
    ok, msg = pool.run("not a number")
    assert not ok and "TypeError" in msg


def test_workers_start_under_a_main_module_that_imported_jax(tmp_path):
  # Spawned workers re-import the parent's main module first; its address
  # space (JAX maps gigabytes) must not eat the worker's memory limit.
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  script = tmp_path / "script.py"
  script.write_text(
      "import jax\n"
      "ZERO = jax.numpy.zeros(())  # Starts the backend at import.\n"
      "from swirl_jax.tools import calculator\n"
      "if __name__ == '__main__':\n"
      "  with calculator.Calculator(num_workers=1) as calc:\n"
      "    print(calc('6*7'))\n")
  out = subprocess.run([sys.executable, str(script)], capture_output=True,
                       text=True, timeout=240)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == "6*7 -> 42"
