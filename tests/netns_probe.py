"""Run on a third host (test_netns.py): knocks on every given TCP port with a message
signed by the given key and reports which ports answered.

    python netns_probe.py KEY_HEX HOST:PORT ...   ->  {"zmtp": [...], "answered": [...]}

A port that does not greet with ZMTP (a TCPStore) is only connected to. A ZMTP port
gets a payload fetch, the one request that any of dynarl's sockets answers from a
peer it has not seen before (the payload servers: an answer names the id as missing)."""
import json
import socket
import sys

import zmq

from dynarl.transport.wire import Codec


def greets_with_zmtp(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=1.0) as s:
        s.settimeout(0.5)
        try:
            return s.recv(1)[:1] == b"\xff"
        except TimeoutError:
            return False  # a TCPStore waits for the client to speak first


def answers(ctx: zmq.Context, codec: Codec, host: str, port: int) -> bool:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{host}:{port}")
    try:
        sock.send_multipart(codec.encode({"fetch": 1}))
        return bool(sock.poll(1500))
    finally:
        sock.close()


def main() -> None:
    codec = Codec(bytes.fromhex(sys.argv[1]))
    ctx = zmq.Context()
    zmtp, answered = [], []
    for target in sys.argv[2:]:
        host, _, port = target.rpartition(":")
        if greets_with_zmtp(host, int(port)):
            zmtp.append(target)
            if answers(ctx, codec, host, int(port)):
                answered.append(target)
    ctx.term()
    print(json.dumps({"zmtp": zmtp, "answered": answered}))


if __name__ == "__main__":
    main()
