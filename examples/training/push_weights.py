"""Pushing new weights to N inference replicas through the job service: the
replicas are rank daemons (here started by `netcoll up`; in production
`docker compose up --scale rank=N` or `netcoll rank` on each host), and the
trainer is a job client. Each new version is one broadcast job whose input is
the trainer's array (sent inline with the job to the root rank) and whose
result every replica keeps as the named buffer "weights" (output=); a `get`
job reads them back to check.

    python3 examples/training/push_weights.py --replicas 3

The same from a shell, with `netcoll up --ranks 3` running, is `netcoll submit
broadcast ...` for generated data; arrays of your own go through the Python
`netcoll.Client` as here.
"""

import argparse
import asyncio
import os
import secrets
import subprocess
import sys

import numpy as np

import netcoll


def start_replicas(n, token):
    """`netcoll up --ranks n` on a free port; the process and the coordinator's address."""
    env = dict(os.environ, NETCOLL_TOKEN=token)
    cmd = [sys.executable, "-m", "netcoll", "up", "--ranks", str(n), "--port", "0", "--http-port", "off"]
    up = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    address = None
    for line in up.stdout:
        if line.startswith("netcoll up: coordinator at "):
            address = line.split()[4].rstrip(";")
        if line.startswith("netcoll up: ready"):
            return up, address
    up.wait()
    sys.exit(f"netcoll up failed (exit {up.returncode})")


async def push(address, token, replicas):
    async with netcoll.Client(address, token=token) as client:
        weights = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float32)
        for version in range(1, 4):
            weights = weights - 0.01 * np.sign(weights)  # the trainer's next version
            job = await client.run("broadcast", inputs=weights, root=0, output="weights", return_result=False)
            assert job["state"] == "succeeded", job["error"]
            held = await client.get("weights")  # one array per replica
            assert len(held) == replicas and all(np.array_equal(h, weights) for h in held)
            seconds = max(t[0] for t in job["timings"].values())  # the slowest replica's time
            print(f"version {version}: {weights.nbytes} bytes on all {replicas} replicas in {seconds * 1e3:.1f} ms")


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args()
    token = secrets.token_urlsafe(24)
    up, address = start_replicas(args.replicas, token)
    try:
        asyncio.run(push(address, token, args.replicas))
        print("push_weights: every replica holds each new version, bit for bit")
    finally:
        up.terminate()  # netcoll up stops its daemons and coordinator on SIGTERM
        up.wait(60)


if __name__ == "__main__":
    main()
