"""The ``fedbroker`` command line: one-shot commands, ``serve``, ``demo``, the client and agent."""
