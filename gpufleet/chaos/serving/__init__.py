"""Serving under load: Locust (headless, bounded) against a service behind its load balancer, and
the request-level figures of gpufleet.slo.serving from what it recorded."""
