"""engine.cuda.Event and coop.training.HostLead: how far the host runs ahead of the device, and
the GIL left free while a graph replay waits for room in the device's queue."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import engine
import engine.cuda as cuda
from coop.training import HostLead
from engine.graphs import CapturedStep


def slow_step():
    """A captured step of about a millisecond of device work (chained matmuls), in one launch."""
    a = engine.tensor(np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32) / 32, device="cuda")

    def work(x):
        for _ in range(8):
            x = x @ a
        return x.sum()

    return CapturedStep(work, warmup=1), a


def test_event_marks_what_was_queued_before_it():
    step, a = slow_step()
    for _ in range(3):
        step(a)
    event = cuda.Event("cuda").record()
    for _ in range(200):  # queued after the event: the event does not wait for them
        step(a)
    event.synchronize()
    assert event.query()
    after = cuda.Event("cuda").record()
    assert not after.query()  # 200 steps of device work are still queued before it
    cuda.synchronize()
    assert after.query()
    assert cuda.Event("cuda").query()  # never recorded: nothing to wait for


def test_host_lead_keeps_the_host_two_steps_ahead():
    step, a = slow_step()
    lead, marks = HostLead("cuda", steps=2), []
    for i in range(40):
        step(a)
        lead.step_queued()
        marks.append(cuda.Event("cuda").record())
        if i >= 2:  # the step two before the last has run: the host is never further ahead
            assert marks[i - 2].query(), i
    cuda.synchronize()


def test_other_threads_run_while_a_replay_waits_for_room_in_the_queue():
    # a thread that gives the GIL up and takes it back all the time, as a worker's upload and
    # download do around each piece of I/O: while replays wait for room in the device's queue, it
    # must get the GIL back at once, not once per step that the device finishes. The step has no
    # inputs and its outputs are not copied, so that a replay is the only launch of each call
    # (a copy launched with the GIL held blocks the same way: HostLead keeps the queue short)
    big = engine.tensor(np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32) / 45, device="cuda")

    def work():
        x = big
        for _ in range(32):  # about a millisecond of device work a step
            x = x @ big
        return x.sum()

    step = CapturedStep(work, warmup=1, clone_outputs=False)
    for _ in range(3):
        step()
    cuda.synchronize()
    turns, stop = [0], threading.Event()

    def turn_taker():
        while not stop.is_set():
            time.sleep(0)  # gives up the GIL and takes it back
            turns[0] += 1

    thread = threading.Thread(target=turn_taker)
    thread.start()
    try:
        started = time.perf_counter()
        for _ in range(2000):  # more than the queue holds: the later replays wait for steps to finish
            step()
        launch_seconds = time.perf_counter() - started
        taken = turns[0]
        cuda.synchronize()
    finally:
        stop.set()
        thread.join()
    if launch_seconds < 0.3:
        pytest.skip(f"the launch queue took all 2000 steps ({launch_seconds:.2f} s): nothing waited for room")
    # with the GIL held through each waiting replay: at most one turn each time a replay returns
    # (14 turns in all were seen while a copy launched with the GIL held did the waiting)
    assert taken > 4 * 2000, (taken, launch_seconds)
