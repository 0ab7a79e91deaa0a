"""The floor: a raw pyzmq request/reply over the same two hops as a toolpool call.

    client DEALER → relay ROUTER | relay ROUTER ← echo DEALER

The relay stands where the daemon stands, the echo where a worker stands; both are
single-threaded loops of plain pyzmq, carrying frames of a call's sizes (a Submit
out, a turn_end event back). Nothing can do the same trip with less work.

    python -m bench.floor relay CLIENT_ENDPOINT WORKER_ENDPOINT
    python -m bench.floor echo WORKER_ENDPOINT REPLY_HEX
"""

from __future__ import annotations

import sys

import zmq


def relay(client_endpoint: str, worker_endpoint: str) -> None:
    context = zmq.Context()
    clients = context.socket(zmq.ROUTER)
    clients.bind(client_endpoint)
    workers = context.socket(zmq.ROUTER)
    workers.bind(worker_endpoint)
    worker, _ = workers.recv_multipart()  # the echo's "ready"
    poller = zmq.Poller()
    poller.register(clients, zmq.POLLIN)
    poller.register(workers, zmq.POLLIN)
    client = b""
    while True:
        ready = dict(poller.poll())
        if clients in ready:
            client, frame = clients.recv_multipart()
            if frame == b"stop":
                workers.send_multipart([worker, b"stop"])
                clients.send_multipart([client, b"stopped"])
                return
            workers.send_multipart([worker, frame])
        if workers in ready:
            _, frame = workers.recv_multipart()
            clients.send_multipart([client, frame])


def echo(worker_endpoint: str, reply: bytes) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(worker_endpoint)
    socket.send(b"ready")
    while True:
        frame = socket.recv()
        if frame == b"stop":
            return
        socket.send(reply)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "relay":
        relay(sys.argv[2], sys.argv[3])
    else:
        echo(sys.argv[2], bytes.fromhex(sys.argv[3]))
