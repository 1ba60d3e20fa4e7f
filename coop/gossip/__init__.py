"""Peer-to-peer mode: peers that train and serve each other over HTTP, merged by gossip (docs/p2p.md).
The run config is coop.runconfig.RunConfig (its [gossip] section), the same as the coordinator's.

    merge.py       the gossip merge rule (shared with `coop simulate --topology gossip`)
    protocol.py    JSON messages (pydantic); payload.py: binary messages (safetensors)
    identity.py    a peer's Ed25519 key, the id derived from it, signatures
    membership.py  member lists, heartbeats' bookkeeping, dead-peer removal
    inbox.py       received updates, by round
    server.py      the FastAPI routes; node.py: the state and checks behind them
    peer.py        the peer: setup, heartbeats, exchange, the training loop, start_swarm / join
    cli.py         `coop swarm start`
"""
