"""The local gateway: a stable URL per model (Red-Black) and per version (Versioned), spreading
requests over the ready instances the rollout controller's routing table lists."""
