"""`python -m amqpbroker` is the `amqpbroker` command."""

from amqpbroker.cli import main

raise SystemExit(main())
