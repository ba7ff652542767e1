"""`looper data_service`: a tf.data service dispatcher or worker, foreground.

Synopsis::

    looper data_service --role=dispatcher --port=5050 [--work_dir=DIR] \\
        [--network=private]
    looper data_service --role=worker --dispatcher=HOST:5050 --port=5051 \\
        [--host=ADDR] [--network=private]
    looper train --config=... --workdir=... --config.data.service=HOST:5050

One line when the server is up (its address, what it exposes, whether a
restart keeps the jobs), one when it stops: SIGTERM or SIGINT stop it and
exit 0. A worker may join while a run trains (the dispatcher hands it
pieces of the running jobs); see looper.data.service for what the run
guarantees.

Who can connect: `--network` declares it (looper.network: loopback, the
default, private or public; TensorFlow's servers listen on every address
of the machine without authentication), checked against this machine's
addresses before the server starts (else one line names the addresses and
the flag). `--host` is the address the dispatcher hands to the trainers for
this worker (default localhost: trainers on this machine only); give the
worker's address on that private network when the trainers run elsewhere.

With `--work_dir` the dispatcher journals its state there
(fault-tolerant mode): restarted with the same directory and port, it
resumes its jobs and the trainers go on. Without it a restart loses every
job, and the runs reading them stop.
"""

import signal
import sys

from absl import flags
import tensorflow as tf

from looper import network
from looper.cli import parsing

FLAGS = flags.FlagValues()  # the tool's own, apart from looper.main's
flags.DEFINE_enum("role", None, ["dispatcher", "worker"], "which server",
                  flag_values=FLAGS)
flags.DEFINE_integer("port", None, "the port to serve on", lower_bound=1,
                     upper_bound=65535, flag_values=FLAGS)
flags.DEFINE_string("work_dir", "", "dispatcher: journal its jobs here, so a"
                    " restart resumes them", flag_values=FLAGS)
flags.DEFINE_string("dispatcher", "", "worker: the dispatcher's HOST:PORT",
                    flag_values=FLAGS)
flags.DEFINE_string("host", "localhost", "the address trainers reach this"
                    " server at (a worker's is handed out by the dispatcher)",
                    flag_values=FLAGS)
flags.DEFINE_enum("network", "loopback", list(network.REACHES),
                  "the addresses this machine may have, as TensorFlow's"
                  " server listens on all of them (module doc)",
                  flag_values=FLAGS)
flags.mark_flags_as_required(["role", "port"], flag_values=FLAGS)
USAGE = ("usage: looper data_service --role=dispatcher --port=P"
         " [--work_dir=DIR] [--network=loopback|private|public]\n"
         "       looper data_service --role=worker --dispatcher=HOST:P"
         " --port=Q [--host=ADDR] [--network=...]")
EXPOSED = ("TensorFlow listens on every interface (0.0.0.0 and ::) without"
           " authentication: whoever reaches port {port} can read or feed the"
           " training data; keep it on a private network or behind a firewall")


def serve(role: str, port: int, *, host: str = "localhost",
          work_dir: str = "", dispatcher: str = ""):
  """Starts the server; returns (it, its start line)."""
  service = tf.data.experimental.service
  exposed = EXPOSED.format(port=port)
  if role == "dispatcher":
    server = service.DispatchServer(service.DispatcherConfig(
        port=port, work_dir=work_dir or None,
        fault_tolerant_mode=bool(work_dir)))
    keeps = (f"a restart with --work_dir={work_dir} resumes its jobs" if
             work_dir else "a restart loses its jobs (give --work_dir to keep"
             " them)")
    return server, (f"looper data_service: dispatcher at {host}:{port}"
                    f" ({exposed}); {keeps}")
  server = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher, worker_address=f"{host}:{port}",
      port=port))
  return server, (f"looper data_service: worker at {host}:{port} for the"
                  f" dispatcher {dispatcher} ({exposed}); it may join or leave"
                  " while a run trains")


class _Stopped(Exception):
  """A stop signal arrived (its number)."""


def _stopped(number, _):
  raise _Stopped(number)


def main(argv=None) -> int:
  """`looper data_service --role=... --port=...`: serves until SIGTERM or
  SIGINT; returns the exit code."""
  extra = parsing.parse_tool_flags(argv, FLAGS, USAGE, missing_args=None)
  role = FLAGS.role
  if extra or (role == "worker") != bool(FLAGS.dispatcher) or (
      role == "worker" and FLAGS.work_dir):
    sys.exit(f"{USAGE}\nlooper: --role={role} takes "
             + ("--dispatcher=HOST:PORT and no --work_dir" if
                role == "worker" else "no --dispatcher")
             + (f" and no arguments ({' '.join(extra)})" if extra else ""))
  refused = network.refusal(FLAGS.network, network.addresses(),
                            declared=f"--network={FLAGS.network}",
                            flag="--network")
  if refused:
    sys.exit(f"looper data_service: {refused}")
  server, line = serve(role, FLAGS.port, host=FLAGS.host,
                       work_dir=FLAGS.work_dir, dispatcher=FLAGS.dispatcher)
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, _stopped)
  try:
    print(line, flush=True)
    while True:
      signal.pause()
  except _Stopped as e:  # raised in this thread, whichever got the signal
    server.stop()
    print(f"looper data_service: {role} at {FLAGS.host}:{FLAGS.port} stopped"
          f" ({signal.Signals(e.args[0]).name})", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
