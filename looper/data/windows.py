"""A virtual array for array mode: row i is a window of one resident 1-D stream.

Synopsis::

    from looper.data import windows
    stream = np.frombuffer(text, np.uint8)       # held once, as it is
    n = len(stream) - 64                 # every offset with a next byte
    inputs = windows.Windows(stream, 64, count=n, dtype=np.int32)
    labels = windows.Windows(stream, 64, start=1, count=n, dtype=np.int32)
    return inputs, labels                # a dataset_fn's arrays

Row i of `Windows(stream, width, stride=S, start=a)` is
stream[a + iS : a + iS + width] cast to `dtype`, for i < count (by default
every window that fits). Array mode (`arrays`) takes one wherever it takes a
numpy array: its length is the number of windows, which are shuffled,
split among replicas, resumed and padded exactly as an array's rows are.
Nothing of size rows x width is ever made: a batch's rows are gathered from
the stream when the batch is (`gather`: one tf.gather of starts[:, None] +
range(width)), so windows at every offset (stride 1) cost the stream alone.
Windows over the same numpy array share one tensor of it (array mode
converts each stream once): the inputs and labels of a language model are
the same bytes, shifted by one.

Where array mode and an experiment treat it as an array it acts as the
[count, width] array it stands for: len(), .shape, .ndim, .dtype, rows
sliced (`w[a:b:k]` is again a Windows) and np.asarray(w), which builds the
whole array (tests, small splits).
"""

import numpy as np
import tensorflow as tf


class Windows:
  """The [count, width] array of windows of a 1-D numpy `stream`.

  Args:
    stream: a 1-D numpy array, kept as it is (no copy).
    width: elements in a window.
    stride: between the starts of rows i and i + 1 (negative: a reversed
      slice's).
    start: where row 0 starts.
    count: rows; None: every window from `start` on that fits.
    dtype: of the rows (cast when gathered: a uint8 stream of bytes can be
      int32 ids); None: the stream's.

  Raises:
    ValueError: a stream that is not 1-D, a width below 1, a stride of 0,
      or a row outside the stream.
  """

  ndim = 2

  def __init__(self, stream: np.ndarray, width: int, *, stride: int = 1,
               start: int = 0, count: int | None = None, dtype=None):
    if not isinstance(stream, np.ndarray) or stream.ndim != 1:
      raise ValueError(
          f"Windows(stream={type(stream).__name__} of shape"
          f" {getattr(stream, 'shape', None)}): the stream must be a 1-D"
          " numpy array; pass np.frombuffer(data, np.uint8) or a flat array")
    if width < 1 or stride == 0:
      raise ValueError(
          f"Windows(width={width}, stride={stride}): the width must be >= 1"
          " and the stride not 0")
    if count is None:
      count = max(0, (len(stream) - width - start) // stride + 1)
    last = start + (count - 1) * stride
    if count < 0 or (count and not (0 <= min(start, last) and
                                    max(start, last) + width <= len(stream))):
      raise ValueError(
          f"Windows(start={start}, stride={stride}, count={count},"
          f" width={width}): a row falls outside the stream of"
          f" {len(stream)}; lower count or start")
    self.stream, self.width, self.stride = stream, width, stride
    self.start, self.count = start, count
    self.dtype = np.dtype(stream.dtype if dtype is None else dtype)

  @property
  def shape(self) -> tuple[int, int]:
    return (self.count, self.width)

  def __len__(self) -> int:
    return self.count

  def __getitem__(self, rows: slice) -> "Windows":
    """Rows `rows` (a slice: array mode's split slices), again virtual."""
    if not isinstance(rows, slice):
      raise TypeError(
          f"Windows[{rows!r}]: index rows with a slice (w[a:b]), or take"
          " np.asarray(w) first")
    picked = range(self.count)[rows]
    return Windows(self.stream, self.width,
                   stride=self.stride * picked.step,
                   start=self.start + picked.start * self.stride,
                   count=len(picked), dtype=self.dtype)

  def __array__(self, dtype=None, copy=None):  # pylint: disable=unused-argument
    starts = self.start + np.arange(self.count) * self.stride
    rows = self.stream[starts[:, None] + np.arange(self.width)]
    return rows.astype(self.dtype if dtype is None else dtype)

  def __repr__(self) -> str:
    return (f"Windows(stream of {len(self.stream)} {self.stream.dtype},"
            f" width={self.width}, stride={self.stride}, start={self.start},"
            f" count={self.count}, dtype={self.dtype})")

  def gather(self, stream: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
    """Rows `indices` (any shape, int64) of these windows, read from
    `stream`, this stream's tensor: shape indices.shape + [width]."""
    starts = self.start + tf.cast(indices, tf.int64) * self.stride
    positions = starts[..., None] + tf.range(self.width, dtype=tf.int64)
    return tf.cast(tf.gather(stream, positions), self.dtype)
