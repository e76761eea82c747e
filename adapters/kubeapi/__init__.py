"""Kubernetes API client helpers shared by the kube and capi adapters: retried calls,
log-safe error text, kubeconfig loading and resource quantities."""
