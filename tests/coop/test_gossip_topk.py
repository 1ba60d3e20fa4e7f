"""Top-k compression over gossip, for real: two peers in this process (each in its own thread,
serving its HTTP API on 127.0.0.1) train four rounds together. The residual that top-k's error
feedback keeps on the sender must carry over from one round to the next, so that nothing a
peer's update did not send is lost, only delayed."""
import threading

import numpy as np
import pytest

from coop.codec import TopKCodec
from coop.gossip.peer import PeerNode, _free_port
from coop.runconfig import RunConfig

ROUNDS = 4
TOKEN = "topk-swarm"


class RecordingTopK(TopKCodec):
    """TopKCodec that remembers, per encode, the update, the residual before and after, and what it sent."""

    def __init__(self, ratio):
        super().__init__(ratio)
        self.calls = []

    def encode(self, update):
        before = {n: a.copy() for n, a in self.residual.items()}
        encoded = super().encode(update)
        after = {n: a.copy() for n, a in self.residual.items()}
        sent = self.decode(encoded.tensors, encoded.metadata)
        self.calls.append({"update": {n: np.asarray(a).copy() for n, a in update.items()}, "before": before,
                           "after": after, "sent": sent})
        return encoded


def _config() -> RunConfig:
    return RunConfig.model_validate({
        "seed": 3, "rounds": {"max_rounds": ROUNDS, "eval_every": 0}, "inner": {"steps": 2, "batch_size": 4},
        "data": {"default_chars": 20000}, "compression": {"codec": "topk", "options": {"ratio": 0.05}},
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "gossip": {"group_size": 2, "exchange_timeout_s": 60, "heartbeat_s": 0.2, "dead_after_s": 30}})


def _peer() -> PeerNode:
    port = _free_port("127.0.0.1")
    node = PeerNode(token=TOKEN, advertise=f"http://127.0.0.1:{port}", quiet=True)
    node.serve("127.0.0.1", port)
    return node


@pytest.fixture
def swarm():
    first, second = _peer(), _peer()
    yield first, second
    for node in (first, second):
        node.leave()


def test_topk_error_feedback_carries_its_residual_across_gossip_rounds(swarm):
    first, second = swarm
    first.setup_new_swarm(_config())
    second.setup_from_peer(first.advertise)  # before round 0: in the groups from round 0
    for node in (first, second):
        node.codec = RecordingTopK(0.05)  # the one codec the peer's round loop encodes with
        node.start_heartbeats()
    errors = []

    def train(node):
        try:
            node.run()
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)

    threads = [threading.Thread(target=train, args=(node,)) for node in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "the peers did not finish their rounds"
    assert not errors, errors

    for node, partner in ((first, second), (second, first)):
        assert node.round == ROUNDS
        assert [r.received_from for r in node.history] == [[partner.peer_id]] * ROUNDS  # they really exchanged
        calls = node.codec.calls
        assert len(calls) == ROUNDS
        assert calls[0]["before"] == {}  # a fresh sender starts with no residual
        for r, call in enumerate(calls):
            if r > 0:  # the residual left by round r - 1 is the one round r starts from
                assert set(call["before"]) == set(calls[r - 1]["after"])
                for name, residual in call["before"].items():
                    np.testing.assert_array_equal(residual, calls[r - 1]["after"][name])
                assert max(float(np.abs(a).max()) for a in call["before"].values()) > 0
            for name, update in call["update"].items():  # nothing lost: update + old residual = sent + new residual
                np.testing.assert_allclose(update.reshape(-1) + call["before"].get(name, 0.0),
                                           call["sent"][name].reshape(-1) + call["after"][name],
                                           rtol=1e-6, atol=1e-7, err_msg=f"round {r} {name}")
        # over all rounds, the sum of what was sent plus the last residual is the sum of the updates
        for name in calls[0]["update"]:
            total = sum(c["update"][name] for c in calls).reshape(-1)
            delivered = sum(c["sent"][name] for c in calls).reshape(-1) + calls[-1]["after"][name]
            np.testing.assert_allclose(delivered, total, rtol=1e-5, atol=1e-6, err_msg=name)

