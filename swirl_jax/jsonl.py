"""JSON Lines and JSON files: the one reader and writer of the package.

Every error names its place: a `FormatError` reads `path:line: reason`
(`path: [i]: reason` for item i of a whole JSON document or table). Lines
are read as bytes and decoded one at a time, so a stray byte is one bad line
and never a bare `UnicodeDecodeError`.

Two kinds of JSONL file:

- Record files this package appends to (trajectory shards, step units,
  metrics): `read(path, parse, torn_tail=True)`. `append` ends every record
  with a newline, so a last line without one was cut short by a killed
  writer, whatever its bytes (half a multi-byte character, half a number):
  it is skipped with a warning, and the next `append` cuts it off before
  writing. Any other bad line, blank ones included, is corruption and
  raises.
- Input files written elsewhere (datasets, corpora): `read(path, parse)`.
  Blank lines are skipped; every other line must parse, the last one too
  (a truncated download is an error, not a record to drop).

`append` adds records with one O_APPEND write and an fsync; `write` replaces
a file atomically (temporary file, fsync, rename); `rewind` keeps the
records a resumed run still vouches for (the rest, and a torn last line, go
in one atomic rewrite); `read_json` reads a whole JSON document with the
same error form.
"""

import json
import logging
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

from swirl_jax import errors

# What a `parse` function raises for a record it cannot use.
_RECORD_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError,
                  SyntaxError)


class FormatError(errors.UserError, ValueError):
  """A file whose content is not what it should be (`path:line: reason`)."""


def dumps(record: Any) -> str:
  """One record as one line of JSON (no newline).

  Objects with `to_json()` give their own JSON text (or a JSON-able value);
  anything else goes through `json.dumps` with non-ASCII kept readable.
  """
  if hasattr(record, "to_json"):
    record = record.to_json()
    text = record if isinstance(record, str) else json.dumps(
        record, ensure_ascii=False)
  else:
    text = json.dumps(record, ensure_ascii=False)
  if "\n" in text:  # json.dumps escapes newlines; guard custom to_json.
    raise ValueError("a record's JSON contains a newline")
  return text


# ------------------------------------------------------------------ reading.


def _reason(e: BaseException) -> str:
  if isinstance(e, KeyError):
    return f"missing field {e.args[0]!r}"
  return str(e).splitlines()[0] if str(e) else type(e).__name__


def _json_reason(e: json.JSONDecodeError) -> str:
  # Some messages end in " at" ("Unterminated string starting at").
  return f"{e.msg.removesuffix(' at')} at column {e.colno}"


def _value(where: str, raw: bytes) -> Any:
  """The JSON value of one line; FormatError naming `where` if bad."""
  raw = raw[:-1] if raw.endswith(b"\n") else raw  # Columns count within it.
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise FormatError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at "
                      f"column {e.start + 1})") from e
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise FormatError(f"{where}: bad JSON ({_json_reason(e)})") from e


def _parsed(where: str, value: Any, parse: Callable | None) -> Any:
  if parse is None:
    return value
  try:
    return parse(value)
  except _RECORD_ERRORS as e:
    raise FormatError(f"{where}: bad record ({_reason(e)})") from e


def iterate(path: str | os.PathLike, parse: Callable[[Any], Any] | None = None,
            *, torn_tail: bool = False) -> Iterator[Any]:
  """The records of a JSONL file: `parse(value)` per line (values if None).

  `torn_tail=True` for record files this package appends to; see the
  module docstring for what each mode accepts.
  """
  with open(path, "rb") as f:
    held = None  # (line number, bytes), held back until we know it's last.
    for no, raw in enumerate(f, 1):
      if held is not None:
        yield from _line(path, *held, parse, torn_tail)
      held = (no, raw)
  if held is None:
    return
  no, raw = held
  if torn_tail and not raw.endswith(b"\n"):
    logging.warning("%s:%d: skipping a torn last line (%d bytes)", path, no,
                    len(raw))
    return
  yield from _line(path, no, raw, parse, torn_tail)


def _line(path, no, raw, parse, torn_tail):
  where = f"{path}:{no}"
  if not raw.strip():
    if torn_tail:
      raise FormatError(f"{where}: empty line inside a record file")
    return
  yield _parsed(where, _value(where, raw), parse)


def read(path: str | os.PathLike, parse: Callable[[Any], Any] | None = None,
         *, torn_tail: bool = False) -> list:
  """All records of a JSONL file; see `iterate`."""
  return list(iterate(path, parse, torn_tail=torn_tail))


def read_json(path: str | os.PathLike) -> Any:
  """A whole JSON document; FormatError `path:line: reason` if bad."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise FormatError(f"{path}:{line}: not UTF-8 (byte 0x{data[e.start]:02x})"
                      ) from e
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise FormatError(f"{path}:{e.lineno}: bad JSON ({_json_reason(e)})"
                      ) from e


def parse_items(path: str | os.PathLike, items: Sequence[Any],
                parse: Callable[[Any], Any],
                indices: Sequence[int] | None = None) -> list:
  """`parse` of each item of a document or table; errors `path: [i]: ...`
  (i: the item's position, or `indices[position]` for a subset)."""
  indices = range(len(items)) if indices is None else indices
  return [_parsed(f"{path}: [{i}]", item, parse)
          for i, item in zip(indices, items)]


# ------------------------------------------------------------------ writing.


def _drop_torn_tail(path: str) -> None:
  """Cuts a last line that lacks its newline (left by a killed writer).

  Appending after it would glue the next record onto the fragment. Record
  files have one writer each, so nobody else is mid-write here.
  """
  with open(path, "rb+") as f:
    size = f.seek(0, os.SEEK_END)
    if size == 0:
      return
    f.seek(size - 1)
    if f.read(1) == b"\n":
      return
    chunk, end = 1 << 16, size
    while end > 0:  # Find the last newline, reading backwards.
      start = max(0, end - chunk)
      f.seek(start)
      k = f.read(end - start).rfind(b"\n")
      if k >= 0:
        keep = start + k + 1
        break
      end = start
    else:
      keep = 0
    logging.warning("%s: dropping a torn last line (%d bytes)", path,
                    size - keep)
    f.truncate(keep)


def _encode(records: Iterable[Any]) -> tuple[bytes, int]:
  lines = [dumps(r) for r in records]
  return "".join(line + "\n" for line in lines).encode("utf-8"), len(lines)


def append(path: str | os.PathLike, records: Iterable[Any]) -> int:
  """Appends records to `path`, one JSON line each; returns how many.

  The batch goes out as one O_APPEND write, then fsync: a crash leaves
  whole lines plus at most one torn last line, which `read(...,
  torn_tail=True)` skips and the next `append` cuts off.
  """
  data, n = _encode(records)
  if not n:
    return 0
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if os.path.exists(path):
    _drop_torn_tail(path)
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    view = memoryview(data)
    while view:  # os.write may write less than asked (rare on files).
      view = view[os.write(fd, view):]
    os.fsync(fd)
  finally:
    os.close(fd)
  return n


def write(path: str | os.PathLike, records: Iterable[Any]) -> int:
  """Replaces `path` with the records, atomically; returns how many."""
  data, n = _encode(records)
  write_bytes(path, data)
  return n


def _torn(path: str) -> bool:
  """Whether the file's last byte is not a newline (a torn last line)."""
  with open(path, "rb") as f:
    if f.seek(0, os.SEEK_END) == 0:
      return False
    f.seek(-1, os.SEEK_END)
    return f.read(1) != b"\n"


def rewind(path: str | os.PathLike, keep: Callable[[Any], bool]) -> int:
  """Keeps the records of the record file `path` for which `keep(value)`
  holds, by one atomic rewrite (a torn last line goes too); returns how
  many were dropped. A missing file is left missing."""
  path = os.fspath(path)
  if not os.path.exists(path):
    return 0
  records = read(path, torn_tail=True)
  kept = [r for r in records if keep(r)]
  if len(kept) < len(records) or _torn(path):
    write(path, kept)
  return len(records) - len(kept)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Replaces `path` with `data`: readers see the old file or the new one."""
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
