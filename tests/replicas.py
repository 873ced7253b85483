#!/usr/bin/env python3
"""Three `moss serve` replicas behind HAProxy, one drained and restarted mid-run (CI runs this).

Starts three replicas (golden checkpoint tiny-a, CPU, `--max-queue 3`) and HAProxy (Debian's) in
front of them, health-checking each on `GET /health`. Twenty client threads send 60 requests
(each its own prompt and seed) through HAProxy; a client honours 429 (waits `Retry-After`) and
503 (a replica loading or draining: waits `Retry-After` or a moment) and sends again. Once a
third of the pictures are in, replica 0 gets SIGTERM: it must exit 0 (its running picture
delivered, its queue answered 503), HAProxy takes it out, and it is started again on the same
port and serves again. Every request must end with its picture, byte-identical to `moss generate`
(batch mode) with the same settings: none lost.

    python3 tests/replicas.py [target/debug/moss]
"""

import base64
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOSS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "moss")
MODEL = os.path.join(ROOT, "golden", "tiny-a")
REQUESTS, CLIENTS, STEPS, SIZE = 60, 20, 2, "64x64"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, name, port, d):
        self.name, self.port, self.log_path = name, port, os.path.join(d, f"{name}.log")
        self.proc = None
        self.start()

    def start(self):
        before = len(self.log()) if os.path.exists(self.log_path) else 0
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([MOSS, "serve", "--model", MODEL, "--device", "cpu", "--port", str(self.port),
                                      "--max-queue", "3"], stderr=log, stdout=subprocess.DEVNULL)
        deadline = time.time() + 120
        while "ready in" not in self.log()[before:]:
            if self.proc.poll() is not None or time.time() > deadline:
                sys.exit(f"{self.name} did not get ready:\n{self.log()}")
            time.sleep(0.05)

    def log(self):
        with open(self.log_path) as f:
            return f.read()


def haproxy(port, replicas, d):
    cfg = os.path.join(d, "haproxy.cfg")
    servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} check" for r in replicas)
    with open(cfg, "w") as f:
        f.write(f"""global
    maxconn 512
defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    retries 3
    option redispatch
    retry-on conn-failure empty-response
frontend moss
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server inter 200ms fall 1 rise 2
{servers}
""")
    subprocess.run(["haproxy", "-c", "-q", "-f", cfg], check=True)
    p = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "haproxy.log"), "w"))
    deadline = time.time() + 30
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        if time.time() > deadline:
            sys.exit("HAProxy does not reach a ready replica")
        time.sleep(0.1)


class Client:
    """Sends request i until it gets its picture; counts what it met on the way."""

    def __init__(self, port):
        self.port, self.lock = port, threading.Lock()
        self.pictures, self.seen = {}, {}

    def count(self, what):
        with self.lock:
            self.seen[what] = self.seen.get(what, 0) + 1

    def send(self, i):
        body = json.dumps({"prompt": f"replica test {i}", "seed": 500 + i, "size": SIZE, "num_inference_steps": STEPS})
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                c.request("POST", "/v1/images/generations", body, {"Content-Type": "application/json"})
                r = c.getresponse()
                data = r.read()
            except OSError:
                self.count("connection error")
                time.sleep(0.2)
                continue
            self.count(r.status)
            if r.status == 200:
                with self.lock:
                    self.pictures[i] = base64.b64decode(json.loads(data)["data"][0]["b64_json"])
                return
            if r.status not in (429, 503):
                sys.exit(f"request {i}: HTTP {r.status}: {data[:300]!r}")
            time.sleep(float(r.getheader("Retry-After") or 0.3))
        sys.exit(f"request {i}: no picture after 600 s")


def reference(d):
    """`moss generate` batch mode of the same 60 (prompt, seed) pairs: the PNGs' bytes."""
    lst = os.path.join(d, "list.jsonl")
    with open(lst, "w") as f:
        for i in range(REQUESTS):
            f.write(json.dumps({"prompt": f"replica test {i}", "seed": 500 + i}) + "\n")
    out = os.path.join(d, "cli")
    subprocess.run([MOSS, "generate", "--model", MODEL, "--device", "cpu", "--size", SIZE, "--steps", str(STEPS),
                    "--prompts", lst, "--out-dir", out, "--name", "{index}.png", "--quiet"], check=True)
    return [open(os.path.join(out, f"{i}.png"), "rb").read() for i in range(REQUESTS)]


def main():
    d = tempfile.mkdtemp(prefix="moss-replicas-")
    replicas = [Replica(f"r{k}", free_port(), d) for k in range(3)]
    front = free_port()
    lb = haproxy(front, replicas, d)
    client = Client(front)
    try:
        todo = list(range(REQUESTS))
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop(0)
                client.send(i)

        # Daemon threads: a run that fails below ends with its message, not with clients retrying on.
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        deadline = time.time() + 300
        while len(client.pictures) < REQUESTS // 3:
            if time.time() > deadline:
                with open(os.path.join(d, "haproxy.log")) as f:
                    tail = f.read()[-2000:]
                sys.exit(f"{len(client.pictures)} pictures after 300 s (responses {client.seen}); HAProxy:\n{tail}")
            time.sleep(0.05)
        r0 = replicas[0]
        r0.proc.send_signal(signal.SIGTERM)
        code = r0.proc.wait(timeout=120)
        drained = r0.log()
        assert code == 0, f"r0 exited {code} after SIGTERM:\n{drained}"
        m = re.search(r"SIGTERM: stopped accepting; (\d+) queued requests answered 503", drained)
        assert m, drained
        served_before = drained.count("POST /v1/images/generations 200")
        r0.start()
        for t in threads:
            t.join(timeout=max(1.0, deadline + 600 - time.time()))
            if t.is_alive():
                sys.exit(f"clients still waiting after 900 s: {len(client.pictures)} pictures (responses {client.seen})")
        after = r0.log()[len(drained):]
    finally:
        lb.send_signal(signal.SIGTERM)
        lb.wait(timeout=30)
        for r in replicas:
            r.proc.send_signal(signal.SIGTERM)
            r.proc.wait(timeout=60)
    want = reference(d)
    assert sorted(client.pictures) == list(range(REQUESTS)), f"lost: {sorted(set(range(REQUESTS)) - set(client.pictures))}"
    for i in range(REQUESTS):
        assert client.pictures[i] == want[i], f"request {i}: the picture differs from moss generate's"
    logs = [r.log() for r in replicas]
    per_replica = [log.count("POST /v1/images/generations 200") for log in logs]
    assert sum(per_replica) == REQUESTS, f"{sum(per_replica)} pictures served for {REQUESTS} requests: {per_replica}"
    assert all(n > 0 for n in per_replica[1:]) and served_before > 0, f"a replica served nothing: {per_replica}"
    assert "POST /v1/images/generations 200" in after, "the restarted replica served nothing"
    print(f"3 replicas behind HAProxy, r0 drained after {served_before} pictures ({m.group(1)} queued answered 503) "
          f"and restarted: {REQUESTS} requests, {REQUESTS} pictures byte-identical to moss generate, none lost; "
          f"pictures per replica {per_replica}; responses seen {dict(sorted(client.seen.items(), key=str))}: ok")


if __name__ == "__main__":
    main()
