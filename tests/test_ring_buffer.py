"""Contract of the live loop's SPSC ring buffer: the native one (rtanon._core.RingBuffer) and the Python
one an install without a C++ compiler runs (rtanon.live.ring_buffer.PyRingBuffer)."""

import threading

import numpy as np
import pytest

from rtanon._core import RingBuffer as NativeRingBuffer
from rtanon.live.ring_buffer import PyRingBuffer


@pytest.fixture(params=[NativeRingBuffer, PyRingBuffer], ids=["cpp", "python"])
def RingBuffer(request):
    return request.param


def test_fifo_order_and_wraparound(RingBuffer):
    rb = RingBuffer(5)
    assert rb.capacity == 5 and rb.readable == 0 and rb.writable == 5
    assert rb.write(np.arange(7, dtype=np.float32)) == 5  # only what fits
    np.testing.assert_array_equal(rb.read(3), [0, 1, 2])
    assert rb.write(np.array([10, 11, 12, 13], dtype=np.float32)) == 3
    np.testing.assert_array_equal(rb.read(100), [3, 4, 10, 11, 12])
    assert rb.readable == 0 and rb.read(4).shape == (0,)


def test_read_into_leaves_tail_untouched_and_discard(RingBuffer):
    rb = RingBuffer(8)
    rb.write(np.ones(3, np.float32))
    out = np.full(5, -1.0, np.float32)
    assert rb.read_into(out) == 3
    np.testing.assert_array_equal(out, [1, 1, 1, -1, -1])
    rb.write(np.arange(4, dtype=np.float32))
    assert rb.discard(2) == 2
    np.testing.assert_array_equal(rb.read(9), [2, 3])


def test_rejects_wrong_dtype_and_shape(RingBuffer):
    rb = RingBuffer(4)
    with pytest.raises(TypeError):
        rb.write(np.zeros(2, np.float64))
    with pytest.raises((ValueError, TypeError)):
        rb.write(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError):
        RingBuffer(0)


def test_concurrent_producer_consumer_keeps_every_sample_in_order(RingBuffer):
    rb = RingBuffer(257)
    n = 200_000
    src = np.arange(n, dtype=np.float32)
    got = []

    def produce():
        i = 0
        while i < n:
            i += rb.write(src[i : i + 97])

    t = threading.Thread(target=produce)
    t.start()
    total = 0
    while total < n:
        block = rb.read(61)
        total += block.shape[0]
        got.append(block)
    t.join()
    np.testing.assert_array_equal(np.concatenate(got), src)
