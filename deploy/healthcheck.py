"""The image's HEALTHCHECK: GET /v1/info from the coop server running in this container, on the
port it was started with (its --port, else $COOP_PORT, else the command's default: 8000 for
coop-coordinator, 8500 for coop swarm start). A worker of an HTTP run serves nothing: healthy while
it runs. Standard library only; exit 0 healthy, 1 not."""
import os
import sys
import urllib.request

def server_command() -> list[str] | None:
    """The command line of this container's coop process (the lowest pid running one)."""
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if any(os.path.basename(a).startswith("coop") for a in argv[:2]):
            return argv
    return None


def port_of(argv: list[str]) -> int | None:
    for i, arg in enumerate(argv):
        if arg == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    if os.environ.get("COOP_PORT"):
        return int(os.environ["COOP_PORT"])
    names = [os.path.basename(a) for a in argv[:3]]  # [python3,] coop-coordinator serve | coop swarm start
    if "coop-coordinator" in names:
        return 8000
    if "coop" in names and "swarm" in argv[:4]:
        return 8500
    return None


def main() -> int:
    argv = server_command()
    if argv is None:
        print("no coop process in this container", file=sys.stderr)
        return 1
    port = port_of(argv)
    if port is None:  # coop-worker join URL: serves nothing (a peer of a p2p run passes --port)
        return 0
    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/info", timeout=4).read()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:  # unreachable, refused, a bad --port: unhealthy, with the reason in docker inspect
        print(f"unhealthy: {error}", file=sys.stderr)
        sys.exit(1)
