"""What runs the instances: the launchers (local processes, Kubernetes), the instance mirror, the
regional model caches and instance logs.
"""
