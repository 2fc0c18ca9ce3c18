"""A stand-in trainer: reports a few epochs of a made-up loss, then exits 0.

Reads what the scheduler tells every replica: ``TSM_REPLICA_ID``, ``TSM_NUM_REPLICAS`` and
``TSM_APP_HANDLE``; ``--epochs`` comes from the app definition.
"""

import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

rank = int(os.environ.get("TSM_REPLICA_ID", "0"))
world = int(os.environ.get("TSM_NUM_REPLICAS", "1"))
print(f"trainer {rank}/{world} of {os.environ.get('TSM_APP_HANDLE', '?')}", flush=True)
loss = 1.0 + rank
for epoch in range(args.epochs):
    loss *= 0.5
    print(f"trainer {rank}: epoch {epoch} loss {loss:.3f}", flush=True)
print(f"trainer {rank}: done", flush=True)
