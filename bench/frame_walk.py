"""The cost of `HandleWatch.split` per incoming frame (fourth attack pass).

Every frame a peer sends after the open is walked for its size and performative code
(`protocol/handles.py`). This splits 200,000 frames (a 1 KiB transfer and a disposition,
the two frames of a message, in 256 KiB reads) and does nothing else with `none`:

    valgrind --tool=callgrind .venv/bin/python bench/frame_walk.py none
    valgrind --tool=callgrind .venv/bin/python bench/frame_walk.py split

(instructions of `split` minus those of `none`) / 200,000 is the cost a frame. Run it
with a compiled build's python for the mypyc figure.
"""

from __future__ import annotations

import sys

from amqpbroker.amqp import sections
from amqpbroker.amqp.frames import frame
from amqpbroker.protocol.handles import HandleWatch

FRAMES = 200_000


def main() -> None:
    transfer = frame(0x14, [sections.UInt(0), sections.UInt(1), b"t", sections.UInt(0)])
    transfer = (len(transfer) + 1024).to_bytes(4, "big") + transfer[4:] + bytes(1024)
    accepted = sections.Described(sections.ULong(0x24), [])
    disposition = frame(0x15, [True, sections.UInt(1), None, True, accepted])
    unit = transfer + disposition
    read = unit * (262_144 // len(unit))
    per_read = 2 * (262_144 // len(unit))
    watch = HandleWatch(131_072)
    if sys.argv[1:] == ["split"]:
        for _ in range(FRAMES // per_read):
            watch.split(read)
    print(f"{FRAMES // per_read * per_read} frames")


if __name__ == "__main__":
    main()
