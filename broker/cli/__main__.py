"""``python -m broker.cli``: the ``fedbroker`` command."""

import sys

from broker.cli.main import main

sys.exit(main())
