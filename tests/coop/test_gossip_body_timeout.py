"""The peer server's time bound on an update's body, for real (a peer serving on 127.0.0.1, raw
sockets as the clients): a body that trickles gets a 408 after `[gossip] body_timeout_s`, and one
whose sender hangs up midway is counted as refused, with no traceback."""
import socket
import time

from coop.gossip.peer import PeerNode, _free_port
from coop.runconfig import RunConfig

TOKEN = "limits-swarm"


def _config(**gossip) -> RunConfig:
    return RunConfig.model_validate({
        "rounds": {"max_rounds": 2, "eval_every": 0}, "inner": {"steps": 1, "batch_size": 2},
        "data": {"default_chars": 20000}, "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "gossip": gossip})


def _peer() -> PeerNode:
    port = _free_port("127.0.0.1")
    node = PeerNode(token=TOKEN, advertise=f"http://127.0.0.1:{port}", quiet=True)
    node.serve("127.0.0.1", port)
    return node


def test_a_trickled_update_gets_408_after_the_body_timeout_and_an_aborted_one_is_counted():
    node = _peer()
    try:
        node.setup_new_swarm(_config(body_timeout_s=0.5))
        host, port = "127.0.0.1", int(node.advertise.rsplit(":", 1)[1])
        head = (f"POST /v1/gossip/0 HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n").encode()
        with socket.create_connection((host, port), timeout=10) as trickler:
            trickler.sendall(head + b"x")  # then nothing: the body never completes
            start = time.monotonic()
            answer = trickler.recv(4096).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - start < 3.0
        refused = node.updates_refused
        with socket.create_connection((host, port), timeout=10) as quitter:
            quitter.sendall(head + b"x" * 10)  # and hangs up mid-body
        deadline = time.monotonic() + 5
        while node.updates_refused == refused and time.monotonic() < deadline:
            time.sleep(0.05)
        assert node.updates_refused == refused + 1
    finally:
        node.leave()
