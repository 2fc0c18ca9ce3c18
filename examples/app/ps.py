"""A stand-in parameter server: says which port it was given and how many shards it holds, then exits 0."""

import os

port = os.environ.get("TSM_PORT_RPC", "?")
shards = int(os.environ.get("NUM_SHARDS", "2"))
print(f"ps: serving {shards} shard(s) on port {port}", flush=True)
for shard in range(shards):
    print(f"ps: shard {shard} ready", flush=True)
print("ps: done", flush=True)
