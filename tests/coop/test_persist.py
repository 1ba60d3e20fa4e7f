"""The coordinator's checkpoints (coop.coordinator.persist): a close waits only until the last
write has read its arrays, not for its fsync; the writes stay one at a time and in order; what a
restart loads is the last complete one; and the weights written are let go once read."""
from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import numpy as np

from coop.coordinator.persist import Checkpointer
from coop.coordinator.state import load_run
from coop.outer import NesterovSGD
from engine import checkpoint


class Weight(np.ndarray):
    """An ndarray a weak reference can follow (to see when the last one goes)."""


def test_a_close_waits_for_the_arrays_to_be_read_not_for_the_disk(tmp_path, monkeypatch):
    fsync_s, fsync = 0.6, checkpoint._fsync_file
    order = []

    def slow_fsync(path):  # a disk slower than the round
        order.append(("fsync", threading.current_thread().name))
        time.sleep(fsync_s)
        fsync(path)

    monkeypatch.setattr(checkpoint, "_fsync_file", slow_fsync)
    outer = NesterovSGD(lr=0.7, momentum=0.9)
    outer.momentum_buffer = {"w": np.zeros(1000, np.float32)}

    async def rounds():
        saver = Checkpointer(tmp_path)
        served = np.arange(1000, dtype=np.float32).view(Weight)
        alive = weakref.ref(served)
        saver.start(1, {"w": served}, outer, [{"round": 0}], {"seed": 1})
        del served
        t0 = time.perf_counter()
        await saver.arrays_read()
        first_read = time.perf_counter()
        read_s = first_read - t0
        gc.collect()
        gone = alive() is None  # read and let go while the write is still on its way to the disk
        outer.momentum_buffer["w"] += 1.0  # the close's outer step, while the write is on the disk
        saver.start(2, {"w": np.full(1000, 2.0, np.float32)}, outer, [{"round": 0}, {"round": 1}], {"seed": 1})
        await saver.arrays_read()  # the second write waits for the first, then reads
        between_s = time.perf_counter() - first_read  # the first's fsync (fsync_s) lies between the two
        await saver.written()
        return read_s, between_s, gone, saver.saved_round

    read_s, between_s, gone, saved = asyncio.run(rounds())
    assert read_s < fsync_s / 2, read_s
    assert between_s > 0.75 * fsync_s, between_s  # one write at a time: the second after the first's fsync
    assert gone
    assert saved == 2
    run = load_run(tmp_path)
    assert run.round == 2 and run.weights["w"][0] == 2.0
    np.testing.assert_array_equal(run.outer_state["momentum_buffer"]["w"], np.ones(1000, np.float32))


def test_a_failed_write_does_not_stop_the_next(tmp_path, monkeypatch):
    writes = {"n": 0}
    save_file = checkpoint.safetensors.numpy.save_file

    def fails_once(tensors, path):
        writes["n"] += 1
        if writes["n"] == 1:
            raise RuntimeError("a write that fails")
        return save_file(tensors, path)

    monkeypatch.setattr(checkpoint.safetensors.numpy, "save_file", fails_once)
    outer = NesterovSGD(lr=0.7, momentum=0.9)

    async def rounds():
        saver = Checkpointer(tmp_path)
        saver.start(1, {"w": np.ones(10, np.float32)}, outer, [], {"seed": 1})
        await saver.arrays_read()  # not left waiting by the failure
        saver.start(2, {"w": np.full(10, 2.0, np.float32)}, outer, [], {"seed": 1})
        await saver.written()
        return saver.saved_round

    assert asyncio.run(rounds()) == 2
    assert load_run(tmp_path).round == 2
