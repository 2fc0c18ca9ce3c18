"""A stand-in data reader: "reads" a few batches from a source given on the command line, then exits 0."""

import sys

source = sys.argv[1] if len(sys.argv) > 1 else "memory://"
for batch in range(3):
    print(f"reader: batch {batch} from {source}", flush=True)
print("reader: done", flush=True)
