"""The running broker: the core composed with a store, member clusters, pools and event sinks,
split by job (admission, binding, recovery, leadership, read model, metrics, MQTT)."""
