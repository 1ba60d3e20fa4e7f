"""The HTTP coordinator: `coop-coordinator serve`. See app.py for the endpoints, rounds.py for
the round state machine, service.py for what happens in a round and state.py for persistence."""
