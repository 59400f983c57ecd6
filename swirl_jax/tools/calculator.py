"""The `<math_exp>` calculator: arithmetic and a little algebra with SymPy.

A query is tokenised by SymPy's parser (implicit multiplication, `^` as
power, `5!`), then evaluated by a small walker over the Python syntax tree
that SymPy's transformations produce. The walker accepts numbers, symbols,
`+ - * / ** %`, and calls to a short whitelist of functions; anything else
(attribute access, subscripts, lambdas, imports, dunder names) is refused,
and nothing is ever passed to `eval`. Powers and factorials are bounded
before they are computed; evaluation runs in a worker process that is
killed on timeout, under a memory limit.

The observation is the paper's `QUERY -> RESULT`: integers print as
integers (`12*7 -> 84`), terminating fractions as decimals (`10/4 -> 2.5`),
other fractions and irrationals as exact value and approximation
(`1/3 -> 1/3 ≈ 0.3333333333`), floats to 12 significant digits. Failures
come back as `QUERY -> Error: ...`, never as exceptions.
"""

import ast
import decimal
import math
import re

import sympy
from sympy.parsing import sympy_parser as sp

from swirl_jax.tools import workers

MAX_QUERY_CHARS = 200
MAX_RESULT_CHARS = 500
MAX_POWER_BITS = 20_000     # |exponent| * log2|base| of one power.
MAX_EXPONENT = 10_000       # For non-integer bases.
MAX_FACTORIAL = 1_000
MAX_SYMBOLS = 8
_APPROX_DIGITS = 10


def _sympy_namespace():
  functions = {
      "sqrt": sympy.sqrt, "cbrt": sympy.cbrt, "root": sympy.root,
      "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan,
      "asin": sympy.asin, "acos": sympy.acos, "atan": sympy.atan,
      "log": sympy.log, "ln": sympy.log, "exp": sympy.exp,
      "Abs": sympy.Abs, "abs": sympy.Abs, "floor": sympy.floor,
      "ceiling": sympy.ceiling, "ceil": sympy.ceiling, "round": _round,
      "factorial": sympy.factorial, "binomial": sympy.binomial,
      "gcd": sympy.gcd, "lcm": sympy.lcm, "Min": sympy.Min, "min": sympy.Min,
      "Max": sympy.Max, "max": sympy.Max, "Rational": sympy.Rational,
      "simplify": sympy.simplify, "expand": sympy.expand,
      "factor": sympy.factor,
  }
  # Atoms SymPy's tokeniser wraps literals and names in.
  atoms = {"Integer": sympy.Integer, "Float": sympy.Float,
           "Symbol": sympy.Symbol}
  constants = {"pi": sympy.pi, "E": sympy.E, "I": sympy.I}
  return sympy, functions, atoms, constants


def _round(x, ndigits=0):
  """Half-up rounding to `ndigits` decimals, exact (no binary artefacts)."""
  ndigits = int(ndigits)
  if abs(ndigits) > 50:
    raise CalculatorError("too many digits to round to")
  exact = decimal.Decimal(str(sympy.N(x, 40)))
  step = decimal.Decimal(1).scaleb(-ndigits)
  return sympy.Rational(str(exact.quantize(step, decimal.ROUND_HALF_UP)))


class CalculatorError(ValueError):
  """A query the calculator refuses or cannot evaluate."""


def _preprocess(query: str) -> str:
  """Rewrites what people write into what SymPy's tokeniser reads."""
  s = query.strip().strip("$").strip()
  s = re.sub(r"\s*=\s*\??\s*$", "", s)  # "12*7 =" and "12*7 = ?"
  for a, b in (("×", "*"), ("÷", "/"), ("−", "-"), ("·", "*"), ("\\cdot", "*"),
               ("\\times", "*"), ("\\div", "/"), ("$", "")):
    s = s.replace(a, b)
  s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)  # 1,000 -> 1000
  # 20% -> (20/100), unless an operand follows: 7 % 3 is a remainder.
  s = re.sub(r"(\d+(?:\.\d+)?)\s*%(?!\s*[\w(])", r"(\1/100)", s)
  return s


def _to_tree(s: str) -> ast.Expression:
  _, functions, atoms, constants = _sympy_namespace()
  names = {**functions, **atoms, **constants}
  transformations = sp.standard_transformations + (
      sp.implicit_multiplication, sp.convert_xor)
  try:
    code = sp.stringify_expr(s, {}, dict(names), transformations)
    tree = ast.parse(code, mode="eval")
  except Exception as e:  # SymPy's tokeniser raises many kinds.
    raise CalculatorError(f"cannot parse expression ({type(e).__name__})")
  # The tokeniser turns an unknown `f(x)` into `Function('f')(x)`.
  unknown = re.search(r"\bFunction\W*'([^']*)'", code)
  if unknown:
    raise CalculatorError(f"function {unknown.group(1)!r} is not allowed")
  return tree


class _Walker:
  """Evaluates a whitelisted syntax tree with SymPy, bounding every step."""

  def __init__(self):
    self.sympy, self.functions, self.atoms, self.constants = (
        _sympy_namespace())
    self.symbols = set()

  def eval(self, node):
    method = getattr(self, "_" + type(node).__name__, None)
    if method is None:
      raise CalculatorError(f"{type(node).__name__} is not allowed")
    return method(node)

  def _Expression(self, node):
    return self.eval(node.body)

  def _Constant(self, node):
    if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
      raise CalculatorError(f"constant {node.value!r} is not allowed")
    return self.sympy.sympify(node.value)

  def _Name(self, node):
    if node.id in self.constants:
      return self.constants[node.id]
    raise CalculatorError(f"name {node.id!r} is not allowed")

  def _UnaryOp(self, node):
    x = self.eval(node.operand)
    if isinstance(node.op, ast.USub):
      return -x
    if isinstance(node.op, ast.UAdd):
      return x
    raise CalculatorError(f"operator {type(node.op).__name__} is not allowed")

  def _BinOp(self, node):
    a, b = self.eval(node.left), self.eval(node.right)
    op = type(node.op)
    if op is ast.Add:
      return a + b
    if op is ast.Sub:
      return a - b
    if op is ast.Mult:
      return a * b
    if op is ast.Div:
      return a / b
    if op is ast.Mod:
      return self.sympy.Mod(a, b)
    if op is ast.Pow:
      _check_power(a, b)
      return a ** b
    raise CalculatorError(f"operator {op.__name__} is not allowed")

  def _Call(self, node):
    func = node.func
    if not isinstance(func, ast.Name) or node.keywords:
      raise CalculatorError("only plain function calls are allowed")
    name = func.id
    if name in self.atoms:
      return self._atom(name, node.args)
    fn = self.functions.get(name)
    if fn is None:
      raise CalculatorError(f"function {name!r} is not allowed")
    args = [self.eval(a) for a in node.args]
    if name in ("factorial", "binomial") and args:
      _check_factorial(args[0])
    return fn(*args)

  def _atom(self, name, args):
    if len(args) != 1 or not isinstance(args[0], ast.Constant):
      raise CalculatorError(f"malformed {name}")
    value = args[0].value
    if name == "Symbol":
      if (not isinstance(value, str) or not value.isidentifier()
          or value.startswith("_") or len(value) > 24):
        raise CalculatorError(f"name {value!r} is not allowed")
      self.symbols.add(value)
      if len(self.symbols) > MAX_SYMBOLS:
        raise CalculatorError("too many unknowns")
      return self.sympy.Symbol(value)
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
      raise CalculatorError(f"malformed {name}")
    return self.atoms[name](value)


def _check_power(base, exponent):
  """Refuses powers whose exact value would be huge, before computing."""
  if not (exponent.is_number and base.is_number):
    return  # Symbolic powers stay symbolic and cheap.
  if exponent.is_Rational and base.is_Rational:
    if abs(base) in (0, 1):
      return
    # Bits of the result: |exponent| times the bits of base's larger part.
    bits = max(abs(int(base.p)).bit_length(), int(base.q).bit_length())
    if bits * abs(exponent) > MAX_POWER_BITS:
      raise CalculatorError("power too large")
    return
  if exponent.is_real and abs(exponent) > MAX_EXPONENT:
    raise CalculatorError("exponent too large")


def _check_factorial(n):
  if n.is_number and n.is_real and abs(n) > MAX_FACTORIAL:
    raise CalculatorError(f"factorial argument above {MAX_FACTORIAL}")


def evaluate(query: str) -> str:
  """The RESULT text for one query; raises CalculatorError on bad input.

  Runs in the current process without a time limit: use `Calculator` for
  untrusted input.
  """
  if not isinstance(query, str) or not query.strip():
    raise CalculatorError("empty expression")
  if len(query) > MAX_QUERY_CHARS:
    raise CalculatorError(f"expression longer than {MAX_QUERY_CHARS} chars")
  walker = _Walker()
  value = walker.eval(_to_tree(_preprocess(query)))
  text = format_value(value)
  if len(text) > MAX_RESULT_CHARS:
    raise CalculatorError("result too large")
  return text


def format_value(value) -> str:
  """Clean text for a SymPy value (see the module docstring)."""
  if not isinstance(value, sympy.Basic):
    value = sympy.sympify(value)
  if value.has(sympy.zoo) or value.has(sympy.oo) or value.has(-sympy.oo):
    raise CalculatorError("division by zero or infinite result")
  if value.has(sympy.nan):
    raise CalculatorError("undefined result")
  if value.is_Integer:
    return str(int(value))
  if value.is_Rational:
    q = int(value.q)
    while q % 2 == 0:
      q //= 2
    while q % 5 == 0:
      q //= 5
    if q == 1:  # A terminating decimal: exact as a decimal.
      return _exact_decimal(int(value.p), int(value.q))
    return f"{value} ≈ {_approx(value)}"
  if value.is_Float:
    return _float_text(float(value))
  if value.is_number:
    approx = _approx(value)
    return approx if str(value) == approx else f"{value} ≈ {approx}"
  return str(value)


def _exact_decimal(p, q):
  sign = "-" if p < 0 else ""
  p = abs(p)
  whole, rest = divmod(p, q)
  digits = []
  while rest and len(digits) < MAX_RESULT_CHARS:
    rest *= 10
    d, rest = divmod(rest, q)
    digits.append(str(d))
  return f"{sign}{whole}" + ("." + "".join(digits) if digits else "")


def _float_text(x):
  if not math.isfinite(x):
    raise CalculatorError("overflow")
  if x == int(x) and abs(x) < 1e15:
    return str(int(x))
  return f"{x:.12g}"


def _approx(value):
  approx = sympy.N(value, _APPROX_DIGITS)
  if approx.is_Float and abs(approx) < 1e300:
    return f"{float(approx):.{_APPROX_DIGITS}g}"
  return str(approx)  # Huge floats and complex numbers (a + b*I).


def _warm_up():
  evaluate("1+1")  # Warms SymPy's parser and caches.


def _worker_evaluate(query):
  """Worker-side evaluation: ('ok', text) or ('error', message)."""
  try:
    return "ok", evaluate(query)
  except CalculatorError as e:
    return "error", str(e)
  except (ZeroDivisionError, OverflowError, RecursionError, MemoryError) as e:
    return "error", type(e).__name__
  except Exception as e:  # pylint: disable=broad-except
    return "error", f"cannot evaluate ({type(e).__name__})"


def format_observation(query: str, result: str | None = None,
                       error: str | None = None) -> str:
  """`QUERY -> RESULT` or `QUERY -> Error: ...`."""
  query = " ".join(str(query).split())
  if len(query) > MAX_QUERY_CHARS:
    query = query[:MAX_QUERY_CHARS // 2] + "..."
  if error is not None:
    return f"{query} -> Error: {error}"
  return f"{query} -> {result}"


class Calculator:
  """Evaluates `<math_exp>` queries in killable worker processes.

  Usage: `calc = Calculator(); calc("12*7")  # '12*7 -> 84'`. `batch`
  evaluates many queries in parallel. Call `close()` (or use `with`) to
  stop the workers.
  """

  def __init__(self, num_workers: int = 2, timeout_s: float = 3.0,
               memory_bytes: int = 1 << 30):
    self.timeout_s = timeout_s
    self._pool = workers.WorkerPool(_worker_evaluate, num_workers=num_workers,
                                    timeout_s=timeout_s,
                                    memory_bytes=memory_bytes,
                                    initializer=_warm_up)

  def __call__(self, query: str) -> str:
    return self.batch([query])[0]

  def batch(self, queries) -> list[str]:
    queries = [q if isinstance(q, str) else str(q) for q in queries]
    out = [None] * len(queries)
    todo = []
    for i, q in enumerate(queries):
      if not q.strip():
        out[i] = format_observation(q, error="empty expression")
      elif len(q) > MAX_QUERY_CHARS:
        out[i] = format_observation(
            q, error=f"expression longer than {MAX_QUERY_CHARS} chars")
      else:
        todo.append(i)
    replies = self._pool.map([queries[i] for i in todo])
    for i, (ok, reply) in zip(todo, replies):
      if not ok:
        error = ("timed out" if reply.startswith("timed out")
                 else "evaluation failed")
        out[i] = format_observation(queries[i], error=error)
      elif reply[0] == "ok":
        out[i] = format_observation(queries[i], result=reply[1])
      else:
        out[i] = format_observation(queries[i], error=reply[1])
    return out

  def close(self):
    self._pool.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
