"""Peer-to-peer mode: peers that train and serve each other over HTTP, merged by gossip (docs/p2p.md).

    merge.py       the gossip merge rule (shared with `coop simulate --topology gossip`)
    config.py      SwarmConfig, the run config a swarm is started with
    protocol.py    JSON messages (pydantic); payload.py: binary messages (safetensors)
    membership.py  member lists, heartbeats' bookkeeping, dead-peer removal
    inbox.py       received updates, by round
    server.py      the FastAPI routes; node.py: the state and checks behind them
    peer.py        the peer: setup, heartbeats, exchange, the training loop, start_swarm / join
    cli.py         `coop swarm start`
"""
