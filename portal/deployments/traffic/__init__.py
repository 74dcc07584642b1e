"""What the gateways read from Redis: the routing table, the caller keys, and waking a deployment
scaled to zero.
"""
