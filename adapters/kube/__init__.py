"""Kubernetes member clusters: translation of Node/Pod objects, list+watch, kubeconfig."""
