"""The scheduling core: capacity ledger, pending queue, cycle, gang lifecycle, burst controller.

Synchronous and free of I/O: every driver (the service, the simulator, the benchmarks) runs
this same core; only the clock and the adapters differ.
"""
