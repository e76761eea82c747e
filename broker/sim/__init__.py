"""The simulator: trace readers, arrivals, workload mixes, the fill and replay protocols, plots."""
