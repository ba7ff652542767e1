"""GCE preemption and maintenance notices stop training as SIGTERM does.

A fake metadata server on 127.0.0.1 (an ephemeral port) stands in for
GCE's: it answers only requests with `Metadata-Flavor: Google` (403
without, as GCE does) and holds long polls as GCE does. The test
environment points GCE_METADATA_IP/HOST at a dead loopback port
(tests/fixtures/processes.py); these tests point them at the fake: nothing
reaches a real metadata address.
"""

import hashlib
import http.server
import logging
import threading
import time
import urllib.parse

import pytest
import tensorflow as tf

from looper import compat
from looper.control import vm_notices
from tests.fixtures import processes
from tests.fixtures.processes import finish, start_workers, wait_for
from tests.fixtures.stopping import stop_and_resume

PREEMPTED = "a preemption notice (instance/preempted=TRUE)"
MAINTENANCE = ("a maintenance notice"
               " (instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE)")


def etag(value: str) -> str:
  return hashlib.sha1(value.encode()).hexdigest()[:16]


class FakeMetadata(http.server.ThreadingHTTPServer):
  """GCE's metadata server, for the keys looper reads.

  A long poll (`?wait_for_change=true[&last_etag=E][&timeout_sec=T]`) is
  answered once the value's ETag differs from E (no E: once the value
  changes), or after T seconds with the value unchanged.
  """
  daemon_threads = True  # a hanging poll must not hold the test's exit

  def __init__(self):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.values = {"instance/hostname": "fake.c.looper.internal",
                   "instance/preempted": "FALSE",
                   "instance/maintenance-event": "NONE"}
    self.changed = threading.Condition()
    self._revert = {}  # key: (answers left, the value after them)
    self.unavailable = False  # True: 503 for all but the hostname
    self.paths = []  # every request's path and query

  @property
  def address(self) -> str:
    return f"127.0.0.1:{self.server_address[1]}"

  def set(self, key: str, value: str, *, answers: int = 0) -> None:
    """`answers`: only that many answers say `value` (one VM of several
    gets the notice); then `key` holds its old value again."""
    with self.changed:
      self._revert[key] = (answers, self.values[key])
      self.values[key] = value
      self.changed.notify_all()

  def answer(self, key: str) -> str:
    """`key`'s value, for one answer (hold `changed`)."""
    value = self.values[key]
    left, old = self._revert.pop(key, (0, None))
    if left == 1:
      self.values[key] = old
    elif left > 1:
      self._revert[key] = (left - 1, old)
    return value

  def polls(self, key: str) -> int:
    """Long polls of `key` that waited for a change (sent a real ETag)."""
    return sum(1 for p in list(self.paths)
               if p.startswith(f"/computeMetadata/v1/{key}?wait_for_change")
               and "last_etag=0&" not in p)

  def handle_error(self, request, client_address):
    pass  # a client that left while its poll hung: nothing to report


class _Handler(http.server.BaseHTTPRequestHandler):

  def do_GET(self):  # pylint: disable=invalid-name
    server = self.server
    server.paths.append(self.path)
    url = urllib.parse.urlsplit(self.path)
    query = urllib.parse.parse_qs(url.query)
    key = url.path.removeprefix("/computeMetadata/v1/")
    if self.headers.get("Metadata-Flavor") != "Google":
      return self._answer(403, "Missing Metadata-Flavor:Google header.")
    if key not in server.values:
      return self._answer(404, "Not found")
    if server.unavailable and key != "instance/hostname":
      return self._answer(503, "Service Unavailable")
    with server.changed:
      if query.get("wait_for_change") == ["true"]:
        since = query.get("last_etag", [etag(server.values[key])])[0]
        server.changed.wait_for(
            lambda: etag(server.values[key]) != since,
            timeout=float(query.get("timeout_sec", ["60"])[0]))
      value = server.answer(key)
    return self._answer(200, value)

  def _answer(self, status: int, text: str) -> None:
    body = text.encode()
    self.send_response(status)
    self.send_header("Metadata-Flavor", "Google")
    self.send_header("ETag", etag(text))
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):  # keep pytest's output clean
    pass


@pytest.fixture
def fake_metadata(monkeypatch):
  """The fake, where this process and the looper processes it starts look."""
  server = FakeMetadata()
  # Its shutdown waits for the loop's next poll: 0.5 s by default.
  threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                   daemon=True).start()
  for name in ("GCE_METADATA_IP", "GCE_METADATA_HOST"):
    monkeypatch.setenv(name, server.address)
    monkeypatch.setitem(processes.LOOPBACK_ENV, name, server.address)
  try:
    yield server
  finally:
    server.shutdown()
    server.server_close()


def wait_until(condition, timeout=10.0) -> bool:
  deadline = time.monotonic() + timeout
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.01)
  return condition()


def watcher_threads() -> set[threading.Thread]:
  return {t for t in threading.enumerate() if t.name == "looper-notices"}


# --- The watcher, in this process --------------------------------------------


def test_off_gce_the_watcher_ends_at_once_and_says_nothing(caplog):
  # The test environment's address: a loopback port nothing listens on
  # (refused at once, one request: test_compat's on_gce test).
  assert vm_notices.metadata_root() == "http://127.0.0.1:9/computeMetadata/v1/"
  requested, before = [], watcher_threads()
  caplog.set_level(logging.INFO)
  entered, detected = threading.Event(), []

  def detect():  # TensorFlow's test, once this test is inside the context
    detected.append(entered.wait(timeout=30))
    return compat.on_gce()

  with vm_notices.WatchNotices(requested.append, detect=detect):
    entered.set()  # training never waits for the detection
    assert wait_until(lambda: not watcher_threads() - before)
  assert detected == [True]  # it was running when the block began
  assert not requested and not caplog.records


@pytest.mark.parametrize("key,value,reason", [
    ("instance/preempted", "TRUE", PREEMPTED),
    ("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE",
     MAINTENANCE)])
def test_a_notice_requests_one_stop_naming_it(fake_metadata, key, value,
                                               reason):
  requested, before = [], watcher_threads()
  with vm_notices.WatchNotices(requested.append, wait_secs=5):
    # Both keys are being long-polled (a poll with the ETag of FALSE/NONE).
    assert wait_until(lambda: all(fake_metadata.polls(n.key)
                                  for n in vm_notices.NOTICES))
    polls = len(fake_metadata.paths)
    fake_metadata.set(key, value)
    assert wait_until(lambda: requested)
    for notice in vm_notices.NOTICES:  # the other one too: still one stop
      fake_metadata.set(notice.key, notice.value)
    # Each watcher ends once it has seen its notice.
    assert wait_until(lambda: not watcher_threads() - before)
  assert requested == [reason]
  # The held polls answered the changes: no new request (a poll that ran
  # out its 5 s would have asked again).
  assert len(fake_metadata.paths) == polls
  # TensorFlow's GCE test came first.
  assert fake_metadata.paths[0] == "/computeMetadata/v1/instance/hostname"


def test_a_live_migration_and_a_notice_after_the_end_do_not_stop(
    fake_metadata):
  requested, before = [], watcher_threads()
  with vm_notices.WatchNotices(requested.append, wait_secs=1):
    assert wait_until(lambda: fake_metadata.polls("instance/maintenance-event"))
    polls = fake_metadata.polls("instance/maintenance-event")
    # The VM survives a live migration: training goes on.
    fake_metadata.set("instance/maintenance-event",
                      "MIGRATE_ON_HOST_MAINTENANCE")
    assert wait_until(
        lambda: fake_metadata.polls("instance/maintenance-event") > polls)
    fake_metadata.set("instance/maintenance-event", "NONE")
    threads = watcher_threads() - before
  fake_metadata.set("instance/preempted", "TRUE")
  # The held polls come back with it; the watchers end without a word.
  assert wait_until(lambda: not watcher_threads() & threads, timeout=3)
  assert not requested


def test_an_unavailable_server_is_retried_with_one_warning_per_key(
    fake_metadata, caplog):
  fake_metadata.unavailable = True  # as during a maintenance
  requested = []
  with vm_notices.WatchNotices(requested.append, wait_secs=5, retry_secs=0.05):
    assert wait_until(lambda: len(fake_metadata.paths) > 10)
    fake_metadata.set("instance/preempted", "TRUE")
    fake_metadata.unavailable = False
    assert wait_until(lambda: requested)
  assert requested == [PREEMPTED]
  warnings = sorted(r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING)
  root = f"http://{fake_metadata.address}/computeMetadata/v1/"
  assert warnings == [
      f"Could not read {root}{key} (HTTP Error 503: Service Unavailable);"
      " retrying every 0.05 s." for key in ("instance/maintenance-event",
                                             "instance/preempted")
  ] + [f"Received {PREEMPTED}: stopping after the current step and saving"
       " a checkpoint."]


def test_requests_never_go_through_a_proxy(fake_metadata, monkeypatch):
  for name in ("http_proxy", "HTTP_PROXY"):
    monkeypatch.setenv(name, "http://127.0.0.1:9")  # a dead proxy
  requested = []
  # TensorFlow's test (requests) honours the proxy: this one asks nothing.
  with vm_notices.WatchNotices(requested.append, detect=lambda: True,
                            wait_secs=5):
    fake_metadata.set("instance/preempted", "TRUE")
    assert wait_until(lambda: requested)
  assert requested == [PREEMPTED]


# --- Whole runs: one process, two workers ------------------------------------

TINY = "--config=tests/fixtures/tiny.py"


@pytest.mark.slow  # a subprocess
def test_a_preemption_notice_stops_saves_and_resumes_exactly(
    fake_metadata, tmp_path, unstopped):

  def preempt(unused_proc):
    fake_metadata.set("instance/preempted", "TRUE")

  def back():  # the VM is back: the resumed run is not told again
    fake_metadata.set("instance/preempted", "FALSE")

  stop_and_resume(tmp_path, unstopped, preempt, PREEMPTED,
                  before_resume=back)
  # Nothing but TensorFlow's GCE test and the two keys was asked.
  assert {p.split("?")[0] for p in fake_metadata.paths} == {
      f"/computeMetadata/v1/{k}" for k in (
          "instance/hostname", "instance/preempted",
          "instance/maintenance-event")}


@pytest.mark.slow  # worker processes
def test_a_maintenance_notice_to_one_worker_stops_both_at_one_step(
    fake_metadata, tmp_path):
  workdir = tmp_path / "run"
  procs = start_workers((
      TINY, "--config.train.steps_per_loop=50", "--config.train.steps=100000",
      "--config.eval.every_steps=0", "--config.checkpoint.every_steps=0",
      "--config.distribution.worker_timeout_secs=15",
      f"--workdir={workdir}"), 2, tmp_path)
  try:
    wait_for(procs[0].log, "train step ")  # only the chief logs progress
    # Both workers ask this server (on GCE each its VM's): one gets it.
    sent = time.monotonic()
    fake_metadata.set("instance/maintenance-event",
                      "TERMINATE_ON_HOST_MAINTENANCE", answers=1)
    for proc in procs:
      proc.wait(timeout=90)
    seconds = time.monotonic() - sent
  finally:
    logs = finish(procs, timeout=10)
  assert [p.returncode for p in procs] == [0, 0], logs
  notified = [f"Received {MAINTENANCE}" in log for log in logs]
  assert sorted(notified) == [False, True], logs
  steps = []
  for log, told in zip(logs, notified):
    stopped = [l for l in log.splitlines() if "Stopped by" in l]
    assert len(stopped) == 1, log[-3000:]
    # The other worker stops for its peer's request: not named a notice.
    assert (f"Stopped by {MAINTENANCE} at step " in stopped[0]) == told
    steps.append(int(stopped[0].split(" at step ")[1].split(";")[0]))
  assert steps[0] == steps[1] and steps[0] % 50 == 0, steps
  assert "Traceback" not in logs[0] + logs[1]
  print(f"maintenance notice to both exits: {seconds:.2f} s, step {steps[0]}")
  latest = tf.train.latest_checkpoint(str(workdir / "checkpoints"))
  assert latest == f"{workdir}/checkpoints/ckpt-{steps[0]}"
