"""A controller-like process that commits batches of writes to a store and acknowledges each.

    PYTHONPATH=tests python tests/helpers/store_writer.py DB_PATH SEED COUNT

Prints `ack N` (flushed) after batch N is committed. The crash test SIGKILLs it at chosen acks
and checks that the reopened store holds every acknowledged batch and nothing torn.
"""

from __future__ import annotations

import sys

from helpers.store_batches import batches
from llmgw_twin.store.sqlite import Store


def main() -> None:
    path, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with Store(path) as store:
        for i, batch in enumerate(batches(seed, count)):
            store.commit(batch)
            print(f"ack {i}", flush=True)


if __name__ == "__main__":
    main()
