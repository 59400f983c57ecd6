"""The HTTP judge's request cache (sqlite on disk) and rate limiter."""

import json
import os
import sqlite3
import threading
import time


class RateLimiter:
  """At most `rate` acquisitions per second, across threads (0: no limit)."""

  def __init__(self, rate: float):
    self._interval = 1.0 / rate if rate > 0 else 0.0
    self._next = 0.0
    self._lock = threading.Lock()

  def acquire(self) -> None:
    if not self._interval:
      return
    with self._lock:
      now = time.monotonic()
      wait = self._next - now
      self._next = max(now, self._next) + self._interval
    if wait > 0:
      time.sleep(wait)


class DiskCache:
  """sqlite key -> JSON value, shared by the worker threads."""

  def __init__(self, path: str):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
    self._lock = threading.Lock()
    with self._lock:
      self._db.execute("CREATE TABLE IF NOT EXISTS judge "
                       "(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
      self._db.commit()

  def get(self, key: str):
    with self._lock:
      row = self._db.execute("SELECT value FROM judge WHERE key = ?",
                             (key,)).fetchone()
    return None if row is None else json.loads(row[0])

  def put(self, key: str, value) -> None:
    with self._lock:
      self._db.execute("INSERT OR REPLACE INTO judge VALUES (?, ?)",
                       (key, json.dumps(value)))
      self._db.commit()
