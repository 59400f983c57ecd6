"""The package's import graph keeps the layer order of `swirl_jax.LAYERS`.

Every import between packages is read from the source (ast): a package may
import only from a lower layer, so no import goes upward and no two
packages import each other. Imports of the package inside functions are
not allowed either (function-level imports are for optional third-party
dependencies only).
"""

import ast
import pathlib
import re

import swirl_jax

ROOT = pathlib.Path(swirl_jax.__file__).parent
README = ROOT.parent / "README.md"
LAYER_OF = {p: i for i, layer in enumerate(swirl_jax.LAYERS) for p in layer}


def _package(root: pathlib.Path, path: pathlib.Path) -> str:
  return path.relative_to(root).parts[0].removesuffix(".py")


def _is_package(root: pathlib.Path, name: str) -> bool:
  return (root / name).is_dir() or (root / f"{name}.py").exists()


def _imports(root: pathlib.Path, path: pathlib.Path):
  """(line, imported swirl_jax package, inside a function) per import."""
  tree = ast.parse(path.read_text(), str(path))
  in_fn = {id(n) for f in ast.walk(tree)
           if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
           for n in ast.walk(f)}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      assert node.level == 0, f"{path}:{node.lineno}: relative import"
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
      continue
    targets = {n.split(".")[1] for n in names
               if n.startswith("swirl_jax.")
               and _is_package(root, n.split(".")[1])}
    for target in sorted(targets):
      yield node.lineno, target, id(node) in in_fn


def violations(root: pathlib.Path) -> list[str]:
  out = []
  for path in sorted(root.rglob("*.py")):
    if path == root / "__init__.py":
      continue
    pkg, where = _package(root, path), path.relative_to(root.parent)
    if pkg not in LAYER_OF:
      out.append(f"{where}: {pkg!r} is in no layer of swirl_jax.LAYERS")
      continue
    for line, target, in_fn in _imports(root, path):
      at = f"{where}:{line}"
      if in_fn:
        out.append(f"{at}: import of swirl_jax.{target} inside a function")
      if target == pkg:
        continue
      if target not in LAYER_OF:
        out.append(f"{at}: swirl_jax.{target} is in no layer")
      elif LAYER_OF[target] >= LAYER_OF[pkg]:
        kind = "peer" if LAYER_OF[target] == LAYER_OF[pkg] else "upward"
        out.append(f"{at}: {kind} import {pkg} -> {target}")
  return out


def test_every_import_goes_down_the_layers():
  assert violations(ROOT) == []


def test_every_package_has_a_layer():
  on_disk = {_package(ROOT, p) for p in ROOT.rglob("*.py")} - {"__init__"}
  assert on_disk == set(LAYER_OF)


def test_the_check_catches_upward_peer_and_function_imports(tmp_path):
  fake = tmp_path / "swirl_jax"
  for pkg in ("tools", "tasks"):
    (fake / pkg).mkdir(parents=True)
  (fake / "tools" / "a.py").write_text("from swirl_jax.tasks import records\n")
  (fake / "tasks" / "b.py").write_text(
      "def f():\n  from swirl_jax.tools import parsing\n")
  (fake / "sampling.py").write_text("import swirl_jax.training.step\n")
  (fake / "training.py").write_text("from swirl_jax import paths, sampling\n")
  # A name that is no module of the package is no import between layers.
  (fake / "paths.py").write_text("from swirl_jax import __version__\n")
  (fake / "stray.py").write_text("")
  assert violations(fake) == [
      "swirl_jax/sampling.py:1: peer import sampling -> training",
      "swirl_jax/stray.py: 'stray' is in no layer of swirl_jax.LAYERS",
      "swirl_jax/tasks/b.py:2: import of swirl_jax.tools inside a function",
      "swirl_jax/tools/a.py:1: upward import tools -> tasks",
      "swirl_jax/training.py:1: peer import training -> sampling",
  ]


def _code_map() -> list[str]:
  """The packages the README's code map names, in its order."""
  block = README.read_text().split("## Code map", 1)[1].split("```")[1]
  names = []
  for line in block.splitlines()[2:]:  # After the fence and 'swirl_jax/'.
    head = re.split(r"\s{2,}", line.strip())[0]
    names += [n for n in re.findall(r"(\w+)(?:/|\.py)", head)
              if _is_package(ROOT, n)]
  return names


def test_readme_code_map_lists_the_layers_in_order():
  names = _code_map()
  assert sorted(set(names)) == sorted(LAYER_OF)
  layers = [LAYER_OF[n] for n in names]
  assert layers == sorted(layers), names
