"""The sandbox's serving workload: inference replicas on nodes (replica.py) behind HAProxy (balancer.py)."""
