"""Stopping on a Google Cloud preemption or maintenance notice, as on SIGTERM.

Synopsis::

    with vm_notices.WatchNotices(trainer.stop.request):
      controller.train()    # returns early, saved, after a notice

On a Compute Engine VM or a TPU VM the metadata server announces the end
of the VM before it comes: `instance/preempted` turns `TRUE` (a Spot or
preemptible VM, about 30 s ahead) and `instance/maintenance-event` turns
`TERMINATE_ON_HOST_MAINTENANCE` (a host maintenance that stops the VM).
A watcher thread long-polls each key (`?wait_for_change=true` with the
last ETag: the server answers when the value changes, or after
`timeout_sec` with the same value) and on a notice calls
`request_stop("a preemption notice (instance/preempted=TRUE)")`: the stop a
SIGTERM takes (looper.control.signals), so the Controller saves at the
step reached and the run exits 0; under multi-worker every worker has its
own metadata server and the workers agree on one step
(looper.train.stopping). `MIGRATE_ON_HOST_MAINTENANCE` is a live
migration: the VM survives it and training goes on.

Whether this is a GCE VM is TensorFlow's test (`compat.on_gce`, the one
PreemptionCheckpointHandler makes), run in the watcher thread: training
never waits for it, and off GCE the thread ends at once, saying nothing.
Every request goes to `GCE_METADATA_IP` (default metadata.google.internal),
the address TensorFlow's test asks, and never through an HTTP proxy (the
metadata server is only reachable from the VM itself).
"""

import dataclasses
import http.client
import os
import threading
from typing import Callable
import urllib.request

from absl import logging

from looper import compat

# How long one long poll may hang before the server answers "no change"
# (GCE's timeout_sec); the socket waits this much longer for the answer.
WAIT_SECS = 60
SOCKET_MARGIN_SECS = 10
# After a failed request (the server answers 503 during a maintenance).
RETRY_SECS = 1.0


@dataclasses.dataclass(frozen=True)
class Notice:
  """A metadata key, and its value that says the VM is about to go."""
  key: str  # under computeMetadata/v1/
  value: str
  what: str  # how the stop's reason names it

  @property
  def reason(self) -> str:
    return f"{self.what} ({self.key}={self.value})"


NOTICES = (
    Notice("instance/preempted", "TRUE", "a preemption notice"),
    Notice("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE",
           "a maintenance notice"),
)


def metadata_root() -> str:
  """The metadata server's URL, as TensorFlow's `on_gcp` builds it."""
  host = os.environ.get("GCE_METADATA_IP", "metadata.google.internal")
  return f"http://{host}/computeMetadata/v1/"


class WatchNotices:
  """A context in which a notice of NOTICES calls `request_stop(reason)`,
  once; on GCE only (`detect`), and never after the context is left."""

  def __init__(self, request_stop: Callable[[str], None], *,
               detect: Callable[[], bool] = compat.on_gce,
               wait_secs: int = WAIT_SECS, retry_secs: float = RETRY_SECS):
    self._request_stop = request_stop
    self._detect = detect
    self._wait_secs = wait_secs
    self._retry_secs = retry_secs
    self._root = None
    self._done = threading.Event()  # left, or a notice came: watch no more
    self._notified = threading.Lock()
    # No proxy: an HTTP(S)_PROXY from the environment would send the
    # requests off the VM.
    self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

  def __enter__(self):
    self._root = metadata_root()
    _thread(self._detect_and_watch, "looper-notices")
    return self

  def __exit__(self, *exc):
    # A poll under way ends with its timeout (daemon threads: the process
    # does not wait for them); what it brings back is ignored.
    self._done.set()
    return False

  def _detect_and_watch(self):
    if not self._detect():
      return  # not a GCE VM: nothing to watch
    logging.info("On Google Compute Engine: a preemption or maintenance"
                 " notice from %s will stop training and save a checkpoint.",
                 self._root)
    for notice in NOTICES[1:]:
      _thread(self._watch, "looper-notices", notice)
    self._watch(NOTICES[0])

  def _watch(self, notice: Notice) -> None:
    """Long-polls `notice.key` until its value announces the end, or the
    context is left."""
    etag = "0"  # matches no value's: the first answer comes at once
    warned = False
    while not self._done.is_set():
      try:
        value, etag = self._get(notice.key, etag)
      except (OSError, http.client.HTTPException) as e:  # URLError, 503
        if not warned:  # once a key: a flapping server would flood the log
          logging.warning("Could not read %s%s (%s); retrying every %g s.",
                          self._root, notice.key, e, self._retry_secs)
          warned = True
        self._done.wait(self._retry_secs)
        continue
      if value == notice.value:
        self._notify(notice)
        return

  def _get(self, key: str, etag: str | None) -> tuple[str, str | None]:
    """`key`'s value and ETag once its ETag differs from `etag` (None: once
    the value changes), or at the server's timeout."""
    since = f"&last_etag={etag}" if etag else ""
    request = urllib.request.Request(
        f"{self._root}{key}?wait_for_change=true{since}"
        f"&timeout_sec={self._wait_secs}",
        headers={"Metadata-Flavor": "Google"})
    with self._opener.open(
        request, timeout=self._wait_secs + SOCKET_MARGIN_SECS) as response:
      # A server without ETags gets plain waits for a change (never a busy
      # loop of "0"s answered at once).
      return (response.read().decode("utf-8").strip(),
              response.headers.get("ETag"))

  def _notify(self, notice: Notice) -> None:
    # One stop, the first notice's: the other key's watcher may see its own
    # at the same moment.
    with self._notified:
      if self._done.is_set():
        return
      self._done.set()
    logging.warning("Received %s: stopping after the current step and"
                    " saving a checkpoint.", notice.reason)
    self._request_stop(notice.reason)


def _thread(target: Callable[..., None], name: str, *args) -> None:
  threading.Thread(target=target, args=args, name=name, daemon=True).start()
