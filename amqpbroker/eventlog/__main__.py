"""`python -m amqpbroker.eventlog`: the event-log writer process (B-170), started by
`writer.EventLogWriter.start()`.

A launcher, so that `child.py` can be a mypyc extension in the compiled build (issue 20:
about half the writer's CPU a message): `python -m` runs only a source module. It imports
nothing but `child` (pure Python where nothing was compiled).
"""

from __future__ import annotations

from amqpbroker.eventlog.child import run

if __name__ == "__main__":
    run()
