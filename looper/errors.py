"""The error types and one-line messages: the floor every module may import.

Synopsis::

    from looper import errors
    raise errors.ConfigError("config.train.batch_size=0: must be >= 1; set ...")
    errors.first_line(keras_error)        # its informative first line
    errors.xla_op(e)                      # 'AsString' from XLA's error text
    errors.compile_error(e, jit_compile=False)  # XLA's, or None (data)
    errors.cluster_error(e, timeout)      # one line: a lost worker or job

looper's promise 4: a bad config, a bad dataset or a lost worker ends with
ONE line that names the field (or the worker) and the fix. The types here
carry such lines; the parsers turn TensorFlow's pages of text into them.
This module imports nothing of looper (and TensorFlow only when a
TensorFlow error is parsed), so everything may import it.
"""

import re


class ConfigError(ValueError):
  """A config value is wrong; the message is one line naming field and fix."""


class CheckpointError(ValueError):
  """A checkpoint cannot be used; the message names it and the fix."""


class CheckpointMissing(CheckpointError):
  """The checkpoint's files are not there (never written, or deleted)."""


class DataError(ValueError):
  """An example deep in a split broke a train or eval loop, or the eval
  split changed under the run; one line naming the split, the steps and
  the fix. Nothing was saved after it."""


class WorkdirError(ValueError):
  """Another run holds the workdir (or took it over from this one): one
  line naming the holder and the fix (see looper.workdir.lease)."""


def first_line(e: BaseException) -> str:
  """The informative first line of an error, for a one-line message.

  Keras leads with a generic "Exception encountered when calling ..." line
  and colours the rest for a terminal; both are dropped.
  """
  text = re.sub(r"\x1b\[[0-9;]*m", "", getattr(e, "message", None) or str(e))
  lines = [l.strip() for l in text.splitlines() if l.strip() and
           not l.startswith("Exception encountered when calling")]
  return lines[0] if lines else type(e).__name__


# Lines of a TensorFlow op error that are where, not what: the graph's
# stack of frames, Python tracebacks quoted from a py_function, node names.
_WHERE = re.compile(
    r"^(Graph execution error:|Detected at node|File \"|<stack traces|"
    r"Traceback \(most recent|Stack trace of op|\+ |\| |\^+$|\[\[)")


def op_message(e: Exception, limit: int = 200) -> str:
  """TensorFlow's own words for what a failed op met, on one short line:
  the error a py_function raised if any, else the first line that is not
  a stack frame, a node name or a traceback."""
  text = re.sub(r"\{\{function_node [^}]*\}\}|\[\[\{\{node [^]]*\]\]|"
                r"\[\[[^]]*\]\]|\[Op:[^]]*\]", "",
                getattr(e, "message", None) or str(e))
  lines = [l.strip() for l in text.splitlines()]
  lines = [l for l in lines if l and not _WHERE.match(l)]
  raised = [m.group(1) for m in map(re.compile(r"^\w+(?:Error|Exception): (.+)"
                                               ).match, lines) if m]
  if raised:
    line = raised[-1]
  else:  # a line ending in ':' goes on in the next one
    line = ""
    for part in lines:
      line = f"{line} {part}".strip()
      if not line.endswith(":"):
        break
    line = line or type(e).__name__
  line = re.sub(r"^Error in user-defined function passed to \S+"
                r" transformation with iterator: \S+: ", "", line)
  line = " ".join(line.split())
  return line if len(line) <= limit else line[:limit - 3] + "..."


def data_error(e: Exception, *, field: str, split: str, where: str
               ) -> DataError:
  """The one line for an op of a train or eval loop that failed on the data
  of `split` (field: data.train_split or data.eval_split) `where` (e.g. "of
  train steps 41-50"): a label out of range, a NaN under
  tf.debugging.enable_check_numerics, a later example of another shape.
  looper's dry run checked only a split's first examples."""
  return DataError(
      f"config.{field}={split!r}: a batch {where} failed ({op_message(e)});"
      " fix what dataset_fn yields there (looper checked the first examples"
      " only); nothing was saved after the last checkpoint")


def unwritable_workdir(workdir: str, e: Exception) -> ConfigError:
  """The one line for a --workdir that cannot be written (a file in its
  path, no permission): raised before anything else is written."""
  return ConfigError(
      f"--workdir={workdir} is not a writable directory ({first_line(e)});"
      " choose another --workdir")


class DiskFull(WorkdirError):
  """A write to the workdir failed for want of space, quota or write
  access: one line naming the directory, what was being written, the size
  it needs if known, the checkpoint kept and the fix
  (looper.workdir.files.full_disk)."""


def xla_op(e: Exception) -> str | None:
  """The op an XLA compile error names (e.g. 'AsString'), or None."""
  found = re.search(r"compile graph .* on XLA_\w+: (\w+)", str(e))
  return found.group(1) if found else None


# How XLA (the CPU/GPU JIT and the TPU compiler alike) says a graph did not
# compile: an InvalidArgumentError like a bad label's, but the model's.
_COMPILE_FAILED = re.compile(
    r"compile graph .* on XLA_\w+|Compilation failure|TPU compilation"
    r" failed|XLA compilation requires")


def compile_error(e: Exception, *, jit_compile: bool) -> Exception | None:
  """One line for a train or eval step that XLA could not compile (under
  `train.jit_compile`, or any step on a TPU), naming the op if XLA did;
  None if `e` is not a compile failure (then the data may be at fault)."""
  if not _COMPILE_FAILED.search(str(e)):
    return None
  op = xla_op(e)
  what = f"op {op} is not supported" if op else op_message(e)
  if jit_compile:
    return ConfigError(
        f"config.train.jit_compile=True: the train step does not compile"
        f" with XLA ({what}); set --config.train.jit_compile=False, or"
        " replace that op in the model")
  return ConfigError(
      f"the step does not compile with XLA for this accelerator ({what});"
      " replace that op in the model (`looper check --config=...` lists"
      " every such op, on any machine)")


def step_error(e: Exception, *, jit_compile: bool, field: str, split: str,
               where: str) -> Exception:
  """The one line for a train or eval loop that failed: XLA could not
  compile the step (`compile_error`), else the data (`data_error`)."""
  return (compile_error(e, jit_compile=jit_compile) or
          data_error(e, field=field, split=split, where=where))


_TASK = r"/job:\w+/replica:\d+/task:\d+"


def cluster_error(e: Exception, timeout_secs: float,
                  leader: str | None = None) -> str | None:
  """One line for a multi-worker failure TensorFlow reports in pages.

  `leader`: the task running the coordination service (the chief); a
  worker that cannot reach it learns only that its heartbeats timed out.
  Returns None when `e` is not about a lost or missing task.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  text = str(e)
  missing = re.search(rf"timed out task names:\s*((?:{_TASK}[,\s]*)+)", text)
  if "Barrier timed out" in text and missing:
    tasks = ", ".join(re.findall(_TASK, missing.group(1)))
    return (f"worker {tasks} did not come up within"
            f" distribution.worker_timeout_secs={timeout_secs:g}; start it"
            " with the same TF_CONFIG cluster, or raise the timeout")
  lost = re.search(rf"stopped sending heartbeats\)?:?\s*({_TASK})", text)
  reason = "it stopped sending heartbeats"
  if not lost and isinstance(e, (tf.errors.UnavailableError,
                                 tf.errors.DeadlineExceededError)):
    lost = re.search(rf"remote target:?\s*({_TASK})", text)
    known = re.search(r"Connection reset by peer|Socket closed|Connection"
                      r" refused|timed out", text)
    reason = known.group(0) if known else type(e).__name__
  if re.search(r"Failed to get split: Iteration id \d+ not found|Unknown"
               r" iteration client id \d+", text):
    return ("the tf.data service's dispatcher (config.data.service) lost this"
            " run's job: it restarted without its journal; start it with"
            " --work_dir=DIR to keep jobs, then rerun the same command to"
            " resume from the last checkpoint")
  restart = ("this worker stopped too. Restart all workers with the same"
             " command to resume from the last checkpoint")
  if lost:
    return f"lost worker {lost.group(1)} ({reason}); {restart}"
  if leader and "CoordinationService/Heartbeat" in text:
    return (f"lost the chief {leader} (no answer to heartbeats within"
            f" distribution.worker_timeout_secs={timeout_secs:g}: its host is"
            f" unreachable or gone); {restart}")
  return None
