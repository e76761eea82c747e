"""The scheduling core: capacity, pending work, decisions, the cycle, lifecycle, bursting.

``views`` (indexed cluster capacity, snapshots, filtered snapshots), ``ledger`` (capacity
state and reservations), ``queue`` (pending work, order, fair share, quotas), ``decide``
(the one decision path), ``scheduler`` (``run_cycle``, the per-queue policy), ``preemption``
(victims), ``shapes`` (the unplaceable-shape memo), ``lifecycle`` (a gang after its
placement), ``burst`` (the burst controller). Synchronous and free of I/O: every driver (the
service, the simulator, the benchmarks) runs this same core; only the clock and the
adapters differ.
"""
