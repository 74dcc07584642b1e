"""Deployments across regions: one deployment per region, rolled out in waves."""
